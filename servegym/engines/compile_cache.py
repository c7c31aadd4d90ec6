"""The compile cache a server keeps between launches, owned by the harness and kept sound.

vLLM compiles its model with ``torch.compile`` on start-up and keeps the result (an AOT
artefact and Inductor's C++ kernels, built into ``.so`` files) under ``VLLM_CACHE_ROOT``,
``~/.cache/vllm`` by default: a second start of the same config and versions loads it and
skips most of the compile. Inductor builds each binary in place and counts a file that
exists as built, so a start killed while the compiler or the linker writes one leaves a
short file that every later start of that config loads and dies on (``ImportError:
...main.so: file too short``), in a folder shared with everything else the user runs.

So the harness points each engine's cache at a folder of its own
(:func:`harness_compile_cache`, under ``$SERVEGYM_HOME``) and, before every start, checks
the binaries in it (:func:`scrub`): an ELF file shorter than its own headers say is a torn
write, and the cache entry holding it is discarded (rebuilt by the next start), with one line
saying so. A sound cache is left alone; checking it reads a few bytes of each binary. A
binary whose headers are whole but which still fails to load is caught after the fact: when
a start fails naming a binary of its cache (``ImportError: <path>: ...``), that entry is
discarded (:func:`discard_named`) and the start is tried once more
(:class:`~servegym.engines.served.ManagedServer`).
"""

from __future__ import annotations

import logging
import re
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

from servegym.paths import servegym_home

log = logging.getLogger(__name__)

BINARY_SUFFIXES = (".so", ".o")
"""What the compilers write in place (and may leave torn)."""
ENTRY_PARENT = "torch_compile_cache"
"""The vLLM cache's folder whose grandchildren are whole entries (one compiled config:
``torch_compile_cache/torch_aot_compile/<hash>``), each discarded as one."""


def harness_compile_cache(engine: str) -> Path:
    """The compile cache the harness owns for ``engine``: ``$SERVEGYM_HOME/compile-cache/
    <engine>`` (vLLM keys its entries by config and versions inside it)."""
    return servegym_home() / "compile-cache" / engine


def copy_cache(source: Path, dest: Path, max_bytes: int | None = None) -> int:
    """Copy the regular files under ``source`` into ``dest`` (links and special files are
    left out), or nothing at all when they add up to more than ``max_bytes``; returns the
    bytes copied. A torn file copied along is discarded before the start that would load it
    (:func:`scrub`)."""
    if source.is_symlink() or not source.is_dir():
        return 0
    files = [f for f in source.rglob("*") if f.is_file() and not f.is_symlink()]
    total = sum(f.stat().st_size for f in files)
    if max_bytes is not None and total > max_bytes:
        log.info("compile cache: %s holds %d bytes, over %d: not copied", source, total, max_bytes)
        return 0
    for f in files:
        target = dest / f.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, target)
    return total


def torn_reason(path: Path) -> str | None:
    """Why the binary at ``path`` is torn (an ELF file cut short), or ``None`` if sound.

    An ELF file ends at or after its program and section header tables, whose offsets and
    sizes its first 64 bytes give; a file that stops earlier was not written to the end."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(64)
    except OSError:
        return None  # gone or unreadable: not ours to judge
    if size == 0:
        return "empty"
    if head[:4] != b"\x7fELF":
        return f"{size} bytes, no ELF header"
    if len(head) < 52:
        return f"{size} bytes, shorter than an ELF header"
    wide = head[4] == 2
    order = "<" if head[5] == 1 else ">"
    if wide:
        if len(head) < 64:
            return f"{size} bytes, shorter than an ELF header"
        phoff, shoff = struct.unpack_from(order + "QQ", head, 32)
        phentsize, phnum, shentsize, shnum = struct.unpack_from(order + "HHHH", head, 54)
    else:
        phoff, shoff = struct.unpack_from(order + "II", head, 28)
        phentsize, phnum, shentsize, shnum = struct.unpack_from(order + "HHHH", head, 42)
    needed = max(
        len(head),
        phoff + phentsize * phnum if phnum else 0,
        shoff + shentsize * shnum if shnum else 0,
    )
    if size < needed:
        return f"{size} bytes of {needed}"
    return None


@dataclass(frozen=True)
class Discarded:
    """A cache entry removed because a binary in it was torn."""

    entry: Path
    binary: Path
    reason: str

    def describe(self) -> str:
        return (
            f"compile cache: discarded {self.entry} ({self.binary.name}: {self.reason}; a "
            "start killed mid-compile leaves such a file); the next start rebuilds it"
        )


def _entry_of(root: Path, binary: Path) -> Path:
    """What to discard for a torn ``binary``: its whole entry where the layout has one
    (``torch_compile_cache/<kind>/<hash>``), else the binary alone (Inductor rebuilds a
    missing binary from its source next to it)."""
    parts = binary.relative_to(root).parts
    if ENTRY_PARENT in parts:
        i = parts.index(ENTRY_PARENT)
        if len(parts) > i + 3:
            return root.joinpath(*parts[: i + 3])
    return binary


def scrub(root: Path) -> list[Discarded]:
    """Discard every entry of the cache at ``root`` holding a torn binary; say which.

    Never raises for the cache's contents: a file that cannot be read or removed is left
    (the launch then fails or succeeds on its own)."""
    if not root.is_dir():
        return []
    found: list[Discarded] = []
    done: set[Path] = set()
    for binary in sorted(p for p in root.rglob("*") if p.name.endswith(BINARY_SUFFIXES)):
        entry = _entry_of(root, binary)
        if entry in done or any(d in entry.parents for d in done):
            continue
        reason = torn_reason(binary)
        if reason is None:
            continue
        try:
            if entry.is_dir():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        except OSError as e:
            log.warning("compile cache: cannot discard %s: %s", entry, e)
            continue
        done.add(entry)
        found.append(Discarded(entry, binary, f"torn, {reason}"))
    return found


_BINARY_PATH = re.compile(r"(/[^\s:'\"]+\.(?:so|o))(?![\w.])")


def discard_named(roots: list[str], text: str) -> list[Discarded]:
    """After a start failed: discard the entries of the binaries under ``roots`` that its
    log ``text`` names (a loader quotes the path it could not load)."""
    found: list[Discarded] = []
    for name in dict.fromkeys(_BINARY_PATH.findall(text)):
        path = Path(name)
        for root in map(Path, roots):
            if root not in path.parents or not path.exists():
                continue
            entry = _entry_of(root, path)
            try:
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
            except OSError as e:
                log.warning("compile cache: cannot discard %s: %s", entry, e)
                continue
            found.append(Discarded(entry, path, "the failed start could not load it"))
    return found


__all__ = ["Discarded", "discard_named", "harness_compile_cache", "scrub", "torn_reason"]
