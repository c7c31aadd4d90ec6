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
