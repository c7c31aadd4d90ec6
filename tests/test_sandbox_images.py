"""Sandbox images: the content digest that decides a rebuild, the certificates a build
trusts, the base each Dockerfile names, and (with an engine, marker ``docker``) a real
build reused while its content is unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest

from servegym.errors import UserError
from servegym.sandbox import images
from servegym.sandbox.images import (
    CONTEXT_LABEL,
    IMAGES,
    LOCAL_BASE,
    Recipe,
    context_digest,
    ensure_image,
    extra_ca_certs,
)


def test_digest_follows_files_arguments_and_base(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text("FROM x\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.txt").write_text("a")
    first = context_digest(tmp_path, {"BASE": "x"}, "sha256:1")
    assert first == context_digest(tmp_path, {"BASE": "x"}, "sha256:1")
    assert first != context_digest(tmp_path, {"BASE": "y"}, "sha256:1")
    assert first != context_digest(tmp_path, {"BASE": "x"}, "sha256:2")  # base rebuilt
    (tmp_path / "sub" / "a.txt").write_text("b")
    assert first != context_digest(tmp_path, {"BASE": "x"}, "sha256:1")


def test_every_image_names_its_usual_base() -> None:
    bases = {name: recipe.default_base for name, recipe in IMAGES.items()}
    assert bases["cli-agents"] == "node:22-bookworm-slim"
    assert bases["cpu"] == "python:3.11-slim"
    assert all(":" in base and not base.endswith(":latest") for base in bases.values())


def test_a_dockerfile_without_a_base_argument_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SERVEGYM_DATA_DIR", str(tmp_path))
    (tmp_path / "sandbox" / "odd").mkdir(parents=True)
    (tmp_path / "sandbox" / "odd" / "Dockerfile").write_text("FROM debian:12\n")
    with pytest.raises(UserError, match=r"odd/Dockerfile: has no `ARG BASE=IMAGE` line"):
        _ = Recipe("odd", "t").default_base


def test_extra_certificates_from_the_variable_or_the_local_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local = tmp_path / "local"
    local.mkdir()
    (local / "a.crt").write_text("-----BEGIN CERTIFICATE-----\nA\n-----END CERTIFICATE-----\n")
    (local / "b.crt").write_text("-----BEGIN CERTIFICATE-----\nB\n-----END CERTIFICATE-----\n")
    (local / "ignored.pem").write_text("not this")
    monkeypatch.setattr(images, "LOCAL_CA_DIR", local)
    both = extra_ca_certs({})
    assert both.count("BEGIN CERTIFICATE") == 2 and "not this" not in both
    named = tmp_path / "one.pem"
    named.write_text("-----BEGIN CERTIFICATE-----\nC\n-----END CERTIFICATE-----\n")
    assert "\nC\n" in extra_ca_certs({"SERVEGYM_EXTRA_CA_CERTS": str(named)})
    with pytest.raises(UserError, match=r"SERVEGYM_EXTRA_CA_CERTS=.*missing\.pem: cannot read"):
        extra_ca_certs({"SERVEGYM_EXTRA_CA_CERTS": str(tmp_path / "missing.pem")})
    monkeypatch.setattr(images, "LOCAL_CA_DIR", tmp_path / "none")
    assert extra_ca_certs({}) == ""


def test_unknown_image_is_refused() -> None:
    with pytest.raises(UserError, match="unknown image 'nope' \\(known: cli-agents, cpu"):
        ensure_image(object(), "nope")


@pytest.mark.docker
def test_a_build_is_reused_until_its_content_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from servegym.sandbox.docker_runner import DockerRunner

    client = DockerRunner().client()
    try:
        client.images.get(LOCAL_BASE)
    except Exception:
        pytest.skip(f"{LOCAL_BASE} is not on the engine (servegym setup images --local-base)")
    monkeypatch.setenv("SERVEGYM_DATA_DIR", str(tmp_path))
    folder = tmp_path / "sandbox" / "tiny"
    folder.mkdir(parents=True)
    dockerfile = f"ARG BASE={LOCAL_BASE}\nFROM ${{BASE}}\nRUN echo one > /marker\n"
    (folder / "Dockerfile").write_text(dockerfile)
    monkeypatch.setitem(IMAGES, "tiny", Recipe("tiny", "servegym-test/tiny"))
    try:
        first = ensure_image(client, "tiny", log_dir=tmp_path / "logs")
        again = ensure_image(client, "tiny", log_dir=tmp_path / "logs")
        (folder / "Dockerfile").write_text(dockerfile.replace("one", "two"))
        changed = ensure_image(client, "tiny", log_dir=tmp_path / "logs")
        labels = client.images.get("servegym-test/tiny").labels
    finally:
        client.images.remove("servegym-test/tiny", force=True)
    assert not first.cached and again.cached and not changed.cached
    assert first.base == LOCAL_BASE and first.digest == again.digest != changed.digest
    assert labels[CONTEXT_LABEL] == changed.digest
    assert (tmp_path / "logs" / "tiny.log").read_text().count("docker") >= 2


def _fake_pip(tmp_path: Path, wheel: str | None) -> Path:
    """A stand-in for ``python -m pip download``: writes ``wheel`` into ``--dest`` (or fails),
    and counts its calls."""
    script = tmp_path / "fake-python"
    make = f"open(os.path.join(dest, {wheel!r}), 'w').write('wheel')" if wheel else "sys.exit(1)"
    script.write_text(
        "#!/usr/bin/env python3\n"
        "import os, sys\n"
        f"open({str(tmp_path / 'calls')!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
        "dest = sys.argv[sys.argv.index('--dest') + 1]\n"
        f"{make}\n"
    )
    script.chmod(0o755)
    return script


def test_host_wheels_fetches_once_for_the_images_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheel = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    monkeypatch.setattr(images.sys, "executable", str(_fake_pip(tmp_path, wheel)))
    monkeypatch.setenv("SERVEGYM_TORCH_INDEX", "https://wheels.example/cpu")
    cache = tmp_path / "wheels"
    got = images.host_wheels(("torch==2.13.0+cpu",), cache, tmp_path / "log")
    again = images.host_wheels(("torch==2.13.0+cpu",), cache, tmp_path / "log")
    assert got == again == [cache / wheel]
    calls = (tmp_path / "calls").read_text().splitlines()
    assert len(calls) == 1  # the second found it in the cache
    assert "--no-deps" in calls[0] and "--python-version 3.11" in calls[0]
    assert "--extra-index-url https://wheels.example/cpu" in calls[0]
    assert calls[0].endswith("torch==2.13.0+cpu")
    assert sorted(p.name for p in cache.iterdir()) == [wheel]  # no download folder left


def test_host_wheels_without_a_source_says_both_ways_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(images.sys, "executable", str(_fake_pip(tmp_path, None)))
    with pytest.raises(UserError) as err:
        images.host_wheels(("torch==2.13.0+cpu",), tmp_path / "w", tmp_path / "log")
    assert "this machine's pip has no wheel of torch==2.13.0+cpu" in err.value.message
    assert "SERVEGYM_TORCH_INDEX" in err.value.message and "wheels/ folder" in err.value.message


def test_the_build_context_holds_the_wheels_and_its_digest_follows_them(tmp_path: Path) -> None:
    folder = tmp_path / "cpu"
    (folder / "wheels").mkdir(parents=True)
    (folder / "Dockerfile").write_text("FROM x\nCOPY wheels/ /tmp/wheels/\n")
    (folder / "wheels" / "README.md").write_text("wheels here")
    wheel = tmp_path / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    wheel.write_text("one")
    with images.build_context(folder, []) as context:
        assert context == folder  # nothing to add: the folder itself
        bare = context_digest(context, {})
    with images.build_context(folder, [wheel]) as context:
        assert context != folder
        assert sorted(p.name for p in (context / "wheels").iterdir()) == ["README.md", wheel.name]
        first = context_digest(context, {})
    wheel.write_text("two")
    with images.build_context(folder, [wheel]) as context:
        second = context_digest(context, {})
    assert len({bare, first, second}) == 3
    assert not (folder / "wheels" / wheel.name).exists()  # the source folder is untouched


def test_the_cpu_image_takes_the_pinned_torch_from_the_host() -> None:
    from servegym.engines.cpu_home import TORCH_VERSION

    assert IMAGES["cpu"].wheels == (f"torch=={TORCH_VERSION}",)
    dockerfile = IMAGES["cpu"].dockerfile.read_text()
    assert "COPY wheels/ /tmp/wheels/" in dockerfile
    assert f"/tmp/wheels/torch-{TORCH_VERSION}-*.whl" in dockerfile
    assert (IMAGES["cpu"].dockerfile.parent / "wheels").is_dir()
