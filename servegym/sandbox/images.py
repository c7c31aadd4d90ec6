"""Building ServeGym's sandbox images, cached by content, on a base made here if need be.

Each image of ``sandbox/`` (:data:`IMAGES`) is built from its folder with its base image as
the build argument ``BASE``. The usual base (e.g. ``node:22-bookworm-slim``) is used when the
engine has it or can pull it; where no registry answers, a Debian base is made on this
machine instead (:func:`ensure_local_base`: ``debootstrap`` into a folder, then ``docker
import``; Debian's packages come from its mirror) and the Dockerfile adds what the usual base
would have had.

An image may take wheels from the host (:attr:`Recipe.wheels`): the cpu image's torch is
the CPU build that only the PyTorch wheel index serves, which a machine without a registry
may not reach although its own pip has the wheel (a local wheel folder or index). The
host's pip fetches them (:func:`host_wheels`, cached under the data directory) into the
``wheels/`` folder of a copy of the image's folder, which is what is built.

A built image carries the label ``servegym.context``: a digest of its build context's files
(wheels included), its build arguments and its base image's id (:func:`context_digest`).
:func:`ensure_image` builds only when the image on the engine lacks that digest, so a second
run (or CI's next run on the same machine) reuses it; a change to the Dockerfile, a pinned
version, a wheel or the base rebuilds it.

The ``docker`` command does the work (it streams a build's output, which goes to a log file);
the Docker SDK only looks images up.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker.errors

from servegym.engines.cpu_home import TORCH_VERSION
from servegym.errors import UserError
from servegym.paths import data_dir, servegym_home

CONTEXT_LABEL = "servegym.context"
LOCAL_BASE = "servegym/debian:bookworm"
"""The base made here from Debian's packages when the usual one cannot be pulled."""
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
LOCAL_CA_DIR = Path("/usr/local/share/ca-certificates")
"""Where Debian keeps the certificates a machine's admin added (e.g. an inspecting proxy's)."""
CA_ENV = "SERVEGYM_EXTRA_CA_CERTS"
PULL_TIMEOUT_S = 120.0
BUILD_TIMEOUT_S = 3600.0
WHEEL_TIMEOUT_S = 900.0
INDEX_ENV = "SERVEGYM_TORCH_INDEX"
"""An extra wheel index for the host's pip (as for ``servegym setup cpu``)."""
IMAGE_PYTHON = "3.11"
"""The Python of the images that take wheels (``python:3.11-slim``, Debian bookworm's)."""

Say = Callable[[str], None]


_BASE_ARG = re.compile(r"^ARG BASE=(\S+)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class Recipe:
    """One image of ``sandbox/``: its folder, its tag, and the requirements (``name==version``)
    whose wheels the host's pip puts into its context's ``wheels/`` folder."""

    folder: str
    tag: str
    wheels: tuple[str, ...] = ()

    @property
    def dockerfile(self) -> Path:
        return sandbox_dir() / self.folder / "Dockerfile"

    @property
    def default_base(self) -> str:
        """The base it is usually built on: the Dockerfile's ``ARG BASE=`` default."""
        try:
            text = self.dockerfile.read_text(encoding="utf-8")
        except OSError as err:
            raise UserError(f"{self.dockerfile}: cannot read it ({err.strerror})") from None
        match = _BASE_ARG.search(text)
        if match is None:
            raise UserError(f"{self.dockerfile}: has no `ARG BASE=IMAGE` line")
        return match.group(1)


IMAGES: dict[str, Recipe] = {
    "cli-agents": Recipe("cli-agents", "servegym/cli-agents"),
    "cpu": Recipe("cpu", "servegym/vllm-cpu", wheels=(f"torch=={TORCH_VERSION}",)),
    "vllm": Recipe("vllm", "servegym/vllm"),
    "sglang": Recipe("sglang", "servegym/sglang"),
}
"""The images by name (``servegym setup images NAME``). The gpu images' bases are the engines
themselves: they cannot be made here, so they are only ever pulled."""
MADE_HERE = frozenset({"cli-agents", "cpu"})
"""The images whose Dockerfile can start from :data:`LOCAL_BASE`."""


@dataclass(frozen=True)
class BuildReport:
    """What :func:`ensure_image` did."""

    name: str
    tag: str
    base: str
    digest: str
    cached: bool
    seconds: float
    log: Path | None = None


def sandbox_dir() -> Path:
    """The ``sandbox/`` folder of Dockerfiles (the checkout's, or the wheel's copy)."""
    return data_dir("sandbox")


def context_digest(folder: Path, build_args: Mapping[str, str], base_id: str = "") -> str:
    """A sha256 of every file under ``folder`` (path and bytes), the build arguments and the
    base image's id: what the built image is a function of."""
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(path.relative_to(folder).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    for key in sorted(build_args):
        h.update(f"{key}={build_args[key]}\0".encode())
    h.update(base_id.encode())
    return h.hexdigest()


def extra_ca_certs(environ: Mapping[str, str] | None = None) -> str:
    """PEM certificates a build should trust besides Debian's: the file ``$SERVEGYM_EXTRA_CA_CERTS``
    names, else this machine's locally added ones (:data:`LOCAL_CA_DIR`); "" when none. A
    network whose HTTPS passes an inspecting proxy needs them for npm and pip in a build."""
    env = os.environ if environ is None else environ
    named = env.get(CA_ENV, "").strip()
    if named:
        try:
            return Path(named).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as err:
            raise UserError(f"{CA_ENV}={named}: cannot read it ({err})") from None
    pems: list[str] = []
    for path in sorted(LOCAL_CA_DIR.glob("*.crt")) if LOCAL_CA_DIR.is_dir() else []:
        try:
            pems.append(path.read_text(encoding="utf-8").strip())
        except (OSError, UnicodeDecodeError):
            continue
    return "\n".join(p for p in pems if p)


def _wheel_prefix(requirement: str) -> str:
    """``name==version`` as the start of its wheels' file names (``torch-2.13.0+cpu-``)."""
    name, sep, version = requirement.partition("==")
    if not sep or not name.strip() or not version.strip():
        raise ValueError(f"wheel requirement '{requirement}' is not NAME==VERSION")
    return f"{re.sub(r'[-_.]+', '_', name.strip()).lower()}-{version.strip()}-"


def _have_wheel(folder: Path, requirement: str) -> Path | None:
    prefix = _wheel_prefix(requirement)
    found = sorted(p for p in folder.glob("*.whl") if p.name.lower().startswith(prefix.lower()))
    return found[0] if found else None


def host_wheels(
    requirements: tuple[str, ...],
    folder: Path,
    log: Path,
    *,
    say: Say | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[Path]:
    """A wheel of each requirement in ``folder``, fetched where missing by this machine's pip
    (``pip download --no-deps``, for the images' CPython :data:`IMAGE_PYTHON` on this
    machine's architecture), with its own configuration (local wheel folders and indexes)
    and ``$SERVEGYM_TORCH_INDEX`` as an extra index. A UserError naming both ways out when
    pip cannot get one."""
    env = os.environ if environ is None else environ
    folder.mkdir(parents=True, exist_ok=True)
    out: list[Path] = []
    for requirement in requirements:
        have = _have_wheel(folder, requirement)
        if have is None:
            if say:
                say(f"fetching a wheel of {requirement} with this machine's pip")
            extra = env.get(INDEX_ENV, "").strip()
            machine = platform.machine().lower() or "x86_64"
            with tempfile.TemporaryDirectory(prefix=".download-", dir=folder) as tmp:
                argv = [
                    sys.executable, "-m", "pip", "download", "--disable-pip-version-check",
                    "--no-deps", "--only-binary=:all:", "--implementation", "cp",
                    "--python-version", IMAGE_PYTHON, "--platform", f"manylinux_2_28_{machine}",
                    "--dest", tmp, *(["--extra-index-url", extra] if extra else []), requirement,
                ]  # fmt: skip
                try:
                    _run_logged(argv, log, WHEEL_TIMEOUT_S, f"pip download {requirement}")
                except UserError as err:
                    raise UserError(
                        f"{err.message}; this machine's pip has no wheel of {requirement}: "
                        f"name an index that has one in ${INDEX_ENV}, or put the wheel into "
                        f"the image's wheels/ folder (see sandbox/README.md)"
                    ) from None
                got = _have_wheel(Path(tmp), requirement)
                if got is None:
                    raise UserError(f"pip download {requirement} left no wheel of it (log: {log})")
                have = folder / got.name
                got.replace(have)  # whole or not at all
        out.append(have)
    return out


@contextlib.contextmanager
def build_context(folder: Path, wheels: list[Path]) -> Iterator[Path]:
    """``folder`` itself when no wheel is added; else a temporary copy of it with
    ``wheels`` in its ``wheels/`` folder (hard links where the file system allows)."""
    if not wheels:
        yield folder
        return
    with tempfile.TemporaryDirectory(prefix="servegym-context-") as tmp:
        context = Path(tmp) / folder.name
        shutil.copytree(folder, context)
        (context / "wheels").mkdir(exist_ok=True)
        for wheel in wheels:
            target = context / "wheels" / wheel.name
            try:
                os.link(wheel, target)
            except OSError:
                shutil.copy2(wheel, target)
        yield context


def _image(client: Any, tag: str) -> Any | None:
    try:
        return client.images.get(tag)
    except docker.errors.ImageNotFound:
        return None
    except docker.errors.APIError as err:
        raise UserError(f"docker could not look up image '{tag}': {err}") from err


def _docker() -> str:
    found = shutil.which("docker")
    if found is None:
        raise UserError("the docker command is not installed (apt-get install docker.io)")
    return found


def _run_logged(argv: list[str], log: Path, timeout_s: float, what: str, **kw: Any) -> None:
    """Run ``argv`` with its output appended to ``log``; a UserError with the log's tail."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        out.write(("$ " + " ".join(argv) + "\n").encode())
        out.flush()
        try:
            proc = subprocess.run(
                argv, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s, check=False, **kw
            )
        except subprocess.TimeoutExpired:
            raise UserError(f"{what} took longer than {timeout_s:.0f} s (log: {log})") from None
    if proc.returncode != 0:
        lines = log.read_text(errors="replace").strip().splitlines()
        tail = lines[-1] if lines else "no output"
        raise UserError(f"{what} failed (exit {proc.returncode}): {tail} (log: {log})")


def try_pull(tag: str, log: Path, timeout_s: float = PULL_TIMEOUT_S) -> bool:
    """Whether ``docker pull TAG`` succeeded (False, quietly, when no registry answers)."""
    try:
        _run_logged([_docker(), "pull", tag], log, timeout_s, f"docker pull {tag}")
    except UserError:
        return False
    return True


def ensure_local_base(
    client: Any,
    log: Path,
    *,
    tag: str = LOCAL_BASE,
    suite: str = DEBIAN_SUITE,
    mirror: str = DEBIAN_MIRROR,
    say: Say | None = None,
) -> str:
    """``tag`` on the engine: made, if absent, from Debian's packages (``debootstrap
    --variant=minbase`` into a temporary folder, imported with ``docker import``). Needs
    root and ``debootstrap``; a UserError saying so otherwise."""
    if _image(client, tag) is not None:
        return tag
    debootstrap = shutil.which("debootstrap") or (
        "/usr/sbin/debootstrap" if Path("/usr/sbin/debootstrap").exists() else None
    )
    if debootstrap is None or not hasattr(os, "geteuid") or os.geteuid() != 0:
        raise UserError(
            f"no base image to build on, and none can be made here: making {tag} needs root "
            "and debootstrap (apt-get install debootstrap); or load the usual base with "
            "docker load / docker pull (see sandbox/README.md)"
        )
    if say:
        say(f"making the base image {tag} from Debian {suite} (debootstrap; a few minutes)")
    with tempfile.TemporaryDirectory(prefix="servegym-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        _run_logged(
            [
                debootstrap, "--variant=minbase", "--include=ca-certificates",
                suite, str(rootfs), mirror,
            ],
            log, BUILD_TIMEOUT_S, f"debootstrap {suite}",
        )  # fmt: skip
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        try:
            _run_logged(
                [_docker(), "import", "-c", 'CMD ["bash"]', "-", tag],
                log, BUILD_TIMEOUT_S, f"docker import {tag}", stdin=tar.stdout,
            )  # fmt: skip
        finally:
            if tar.stdout is not None:
                tar.stdout.close()
            tar.wait()
    return tag


def resolve_base(
    client: Any, name: str, log: Path, *, base: str | None = None, say: Say | None = None
) -> str:
    """The base to build image ``name`` on: ``base`` if given; else its usual base when the
    engine has it or can pull it; else (for the images that allow it) :data:`LOCAL_BASE`."""
    if base is not None:
        if _image(client, base) is None and not try_pull(base, log):
            raise UserError(f"--base {base}: not on this Docker engine and it cannot be pulled")
        return base
    recipe = IMAGES[name]
    if _image(client, recipe.default_base) is not None:
        return recipe.default_base
    if say:
        say(f"pulling {recipe.default_base}")
    if try_pull(recipe.default_base, log):
        return recipe.default_base
    if name not in MADE_HERE:
        raise UserError(
            f"image {name}: its base {recipe.default_base} cannot be pulled here, and it "
            "cannot be made from Debian's packages (it is the engine itself)"
        )
    if say:
        say(f"{recipe.default_base} cannot be pulled: building on {LOCAL_BASE}")
    return ensure_local_base(client, log, say=say)


def ensure_image(
    client: Any,
    name: str,
    *,
    base: str | None = None,
    build_args: Mapping[str, str] | None = None,
    log_dir: Path | None = None,
    say: Say | None = None,
) -> BuildReport:
    """Image ``name`` of :data:`IMAGES` built on the engine, reused when its content digest
    matches (see the module docstring); what was done and how long it took."""
    if name not in IMAGES:
        raise UserError(f"unknown image '{name}' (known: {', '.join(IMAGES)})")
    recipe = IMAGES[name]
    folder = recipe.dockerfile.parent
    if not recipe.dockerfile.is_file():
        raise UserError(f"image {name}: no Dockerfile in {folder}")
    log = (log_dir or servegym_home() / "images") / f"{name}.log"
    t0 = time.monotonic()
    chosen = resolve_base(client, name, log, base=base, say=say)
    base_image = _image(client, chosen)
    args = {"BASE": chosen}
    if "ARG EXTRA_CA_CERTS" in recipe.dockerfile.read_text(encoding="utf-8"):
        args["EXTRA_CA_CERTS"] = extra_ca_certs()
    args.update(build_args or {})
    wheels = host_wheels(recipe.wheels, servegym_home() / "images" / "wheels" / name, log, say=say)
    with build_context(folder, wheels) as context:
        digest = context_digest(context, args, str(getattr(base_image, "id", "")))
        have = _image(client, recipe.tag)
        labels = ((getattr(have, "attrs", None) or {}).get("Config") or {}).get("Labels") or {}
        if labels.get(CONTEXT_LABEL) == digest:
            return BuildReport(name, recipe.tag, chosen, digest, True, time.monotonic() - t0)
        if say:
            say(f"building {recipe.tag} on {chosen} (log: {log})")
        argv = [_docker(), "build", "--label", f"{CONTEXT_LABEL}={digest}", "-t", recipe.tag]
        for key, value in sorted(args.items()):
            argv += ["--build-arg", f"{key}={value}"]
        _run_logged([*argv, str(context)], log, BUILD_TIMEOUT_S, f"building {recipe.tag}")
    return BuildReport(name, recipe.tag, chosen, digest, False, time.monotonic() - t0, log)
