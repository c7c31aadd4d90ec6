"""A stand-in engine for tests of the real-server paths: its server is the mock server."""

from __future__ import annotations

import sys
from pathlib import Path

from servegym.engines.base import Engine, ModelRef
from servegym.engines.capabilities import CapabilityTable, allowed_values
from servegym.engines.config import ServingConfig


def mock_model(folder: Path) -> ModelRef:
    """A model folder for the stand-in (a ``config.json`` and nothing else), served as
    ``mock``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text("{}")
    return ModelRef(path=str(folder), served_name="mock")


class StandInEngine(Engine):
    """An engine whose server is the mock server (or a stand-in script), written to
    ``pid_file`` so a test can kill it; it accepts block_size 32 only. It serves a task's
    reference (the mock's outputs, and its prompt log-probabilities, which find every token
    greedy) only when made with ``reference=True``: other tests get no third server."""

    name = "stand-in"
    platform = "cpu"
    table = CapabilityTable(
        engine="stand-in", platform="cpu", rules=(allowed_values("block_size", (32,)),)
    )

    def __init__(
        self,
        pid_file: Path,
        program: list[str] | None = None,
        *,
        reference: bool = False,
        platform: str = "cpu",
    ) -> None:
        self.pid_file = pid_file
        self.program = program
        self.launches = 0
        self.serves_reference = reference
        self.platform = platform
        self.configs: list[ServingConfig] = []

    def command(self) -> list[str]:
        self.launches += 1
        if self.program is not None:
            return self.program
        # write our pid (the group's id), then become the mock server
        code = (
            "import os, sys\n"
            "try: open(sys.argv[1], 'w').write(str(os.getpid()))\n"
            "except OSError: pass\n"
            "os.execv(sys.executable, [sys.executable, '-m', 'servegym.loadgen.mock_server', "
            "*sys.argv[2:]])"
        )
        return [sys.executable, "-c", code, str(self.pid_file)]

    def runtime_dirs(self) -> list[Path]:
        """The test interpreter's venv and the repository (where the mock server's code is),
        so a sandboxed launcher can run it."""
        from servegym.paths import python_runtime_dirs

        venv = Path(sys.prefix)
        return [*python_runtime_dirs(venv), Path(__file__).resolve().parents[1]]

    def tool_dirs(self) -> list[Path]:
        return [Path(sys.executable).parent]

    def render_args(
        self, config: ServingConfig, model: ModelRef, host_addr: str, port: int
    ) -> list[str]:
        self.configs.append(config)
        if self.program is not None:
            return [str(port)]
        return [
            "--host", host_addr, "--port", str(port), "--model", model.served_name,
            "--ttft-ms", "5", "--itl-ms", "5", "--tokens-per-chunk", "1", *config.extra_args,
        ]  # fmt: skip
