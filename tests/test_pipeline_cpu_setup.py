"""``servegym setup cpu`` adds the pipeline's retrieval packages to an existing environment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servegym.cpu_track import setup
from servegym.engines.cpu_home import track_paths


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SERVEGYM_HOME", str(tmp_path))
    paths = track_paths()
    paths.root.mkdir(parents=True)
    paths.manifest.write_text(json.dumps({"model_sha256": "abc"}))
    monkeypatch.setattr(setup, "venv_ok", lambda p: True)
    monkeypatch.setattr(setup, "model_ok", lambda p: True)
    return tmp_path


def test_existing_environment_gets_the_packages_without_a_rebuild(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(setup, "pipeline_ok", lambda p: False)
    monkeypatch.setattr(setup, "install_venv", lambda *a: calls.append("venv"))
    monkeypatch.setattr(setup, "install_pipeline", lambda *a: calls.append("pipeline"))
    report = setup.setup_cpu()
    assert calls == ["pipeline"]
    assert report.pipeline_installed and not report.installed and not report.built
    manifest = json.loads(track_paths().manifest.read_text())
    assert manifest["pipeline_packages"] == list(setup.PIPELINE_PACKAGES)


def test_packages_there_nothing_installed(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(setup, "pipeline_ok", lambda p: True)
    monkeypatch.setattr(setup, "install_pipeline", lambda *a: pytest.fail("reinstalled"))
    assert not setup.setup_cpu().pipeline_installed


def test_install_keeps_torch_pinned(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    argvs: list[list[str]] = []
    monkeypatch.setattr(setup, "_run", lambda argv, *a, **k: argvs.append(argv) or "")
    setup.install_pipeline(track_paths(), home / "log", lambda _: None)
    install = argvs[0]
    assert install[1:4] == ["-m", "pip", "install"]
    assert f"torch=={setup.TORCH_VERSION}" in install
    assert all(p in install for p in setup.PIPELINE_PACKAGES)
    assert len(argvs) == 3  # install, the packages' check, vllm's import check
