"""Rich renderings of what the ``servegym`` command prints."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import Group
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from servegym.engines.sim.engine import SimStats
    from servegym.scoring.metrics import Metrics, Percentiles
    from servegym.workloads.registry import WorkloadInfo
    from servegym.workloads.spec import WorkloadSpec
    from servegym.workloads.summary import WorkloadSummary


def render_workload_list(infos: Sequence[WorkloadInfo]) -> Table:
    table = Table(title="workloads", title_justify="left")
    table.add_column("name", style="bold")
    table.add_column("kind")
    table.add_column("description", overflow="fold")
    for info in infos:
        table.add_row(info.name, info.kind, info.description)
    return table


def _fmt(value: float | int | str | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, (str, bool)):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}"


def _digits(value: float) -> int:
    """Fewer decimals for larger numbers, so tables stay narrow."""
    return 2 if abs(value) < 100 else 1 if abs(value) < 10_000 else 0


_SHOWN_IN_HEADER = {"name", "kind", "seed", "arrival", "content_hash"}


def render_workload_summary(spec: WorkloadSpec, seed: int, summary: WorkloadSummary) -> Group:
    """A header of counts and a table of length percentiles."""
    data = summary.model_dump()
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column(overflow="fold")
    head.add_row("workload", f"{spec.name} ({spec.kind}), seed {seed}")
    head.add_row("arrival", _describe_arrival(spec))
    dists: list[tuple[str, dict[str, float]]] = []
    for key, value in data.items():
        if value is None:
            continue
        if isinstance(value, dict) and {"p50", "p99"} <= set(value):
            dists.append((key, value))
        elif not isinstance(value, (dict, list)) and key not in _SHOWN_IN_HEADER:
            head.add_row(key.replace("_", " "), _fmt(value))
    head.add_row("content hash", str(data.get("content_hash", "")))
    table = Table(title="lengths", title_justify="left")
    table.add_column("")
    cols = [c for c in ("mean", "p50", "p90", "p99", "max") if dists and c in dists[0][1]]
    for c in cols:
        table.add_column(c, justify="right")
    for name, d in dists:
        table.add_row(name.replace("_", " "), *(_fmt(d.get(c)) for c in cols))
    return Group(head, Text(""), table)


def _describe_arrival(spec: WorkloadSpec) -> str:
    a = spec.arrival
    if a.kind in ("poisson", "constant"):
        return f"{a.kind} at {a.rate}/s"
    if a.kind == "gamma":
        return f"gamma at {a.rate}/s, burstiness {a.burstiness}"
    if a.kind == "concurrency":
        return f"closed loop, concurrency {a.concurrency}"
    if a.kind == "trace":
        return f"trace timestamps x {a.time_scale}"
    return a.kind.replace("_", " ")


def render_metrics(m: Metrics, title: str = "metrics") -> Group:
    """The summary a person reads after ``servegym bench``."""
    lat = Table(title=title, title_justify="left")
    lat.add_column("latency (ms)", style="bold")
    for c in ("mean", "p50", "p90", "p95", "p99", "p99.9"):
        lat.add_column(c, justify="right")

    def row(name: str, p: Percentiles) -> None:
        lat.add_row(
            name,
            *(_fmt(v, _digits(v)) for v in (p.mean, p.p50, p.p90, p.p95, p.p99, p.p99_9)),
        )

    row("TTFT", m.ttft_ms)
    row("TPOT", m.tpot_ms)
    row("ITL", m.itl_ms)
    row("E2E", m.e2e_ms)
    if m.sessions is not None:
        row("turn", m.sessions.turn_latency_ms)

    tput = Table.grid(padding=(0, 2))
    tput.add_column(style="bold")
    tput.add_column(justify="right")
    tput.add_row("completed / failed", f"{m.completed:,} / {m.failed:,}")
    tput.add_row("duration", f"{m.duration_s:,.2f} s")
    tput.add_row("request throughput", f"{m.request_throughput:,.2f} req/s")
    tput.add_row("output throughput", f"{m.output_throughput:,.1f} tok/s")
    tput.add_row("total token throughput", f"{m.total_token_throughput:,.1f} tok/s")
    if m.sla_attainment is not None:
        tput.add_row("SLA attainment", f"{m.sla_attainment:.1%}")
        tput.add_row("goodput", f"{m.goodput or 0.0:,.2f} req/s")
    if m.cost_per_mtok is not None:
        tput.add_row("cost", f"${m.cost_per_mtok:,.3f} / M output tokens")
    if m.sessions is not None:
        tput.add_row("sessions", f"{m.sessions.count:,} ({m.sessions.turns:,} turns)")
        tput.add_row("mean turn latency", f"{m.sessions.turn_latency_ms_mean:,.1f} ms")
        tput.add_row("session makespan p50", f"{m.sessions.session_makespan_s.p50:,.2f} s")
    lg = m.loadgen
    tput.add_row("send lag p99", f"{lg.send_lag_ms_p99:.3f} ms")
    if m.recount_mismatches:
        tput.add_row("usage != recount", f"{m.recount_mismatches:,} requests")
    parts: list[Table | Text] = [lat, Text(""), tput]
    if lg.client_bound:
        parts.append(
            Text(
                f"warning: the load generator was client-bound ({lg.reason}); "
                "latencies partly measure the client",
                style="bold yellow",
            )
        )
    if m.errors:
        worst = sorted(m.errors.items(), key=lambda kv: -kv[1])[:3]
        parts.append(Text("errors: " + "; ".join(f"{n} x {msg}" for msg, n in worst), style="red"))
    return Group(*parts)


def render_sim_stats(stats: SimStats) -> Table:
    """The engine-side figures of a simulated run."""
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold")
    t.add_column(justify="right")
    t.add_row("GPUs", str(stats.num_gpus))
    t.add_row("start-up (simulated)", f"{stats.startup_s:,.1f} s")
    t.add_row("KV capacity", f"{stats.kv_capacity_tokens:,} tokens ({stats.kv_blocks:,} blocks)")
    t.add_row("peak KV usage", f"{stats.peak_kv_usage:.1%}")
    t.add_row("preemptions", f"{stats.preemptions:,}")
    hit = stats.prefix_cache_hit_rate
    t.add_row("prefix-cache hit rate", "-" if hit is None else f"{hit:.1%}")
    t.add_row("mean batch size", f"{stats.mean_batch_size:,.1f}")
    t.add_row("modelled accuracy", f"{stats.accuracy_ratio:.3f} of bf16")
    for note in stats.notes:
        t.add_row("note", note)
    return t


def render_sim_catalogue(model: str | None, hardware: str | None) -> Group:
    """Models, hardware and serving knobs with their (vLLM) defaults."""
    from servegym.engines.sim.defaults import KNOBS, knob_defaults
    from servegym.engines.sim.profiles import (
        get_hardware,
        get_model,
        hardware_profiles,
        model_profiles,
    )

    models = Table(title="models (--model)", title_justify="left")
    for c in ("id", "parameters", "layers", "KV heads", "max len", "draft"):
        models.add_column(c)
    for m in model_profiles().values():
        models.add_row(
            m.id,
            f"{m.num_parameters / 1e9:.1f} B",
            str(m.num_layers),
            str(m.num_kv_heads),
            f"{m.max_position_embeddings:,}",
            m.draft_model or "-",
        )
    hw = Table(title="hardware (--hardware)", title_justify="left")
    for c in ("id", "name", "memory", "HBM", "BF16 dense", "FP8 dense", "$/GPU-h"):
        hw.add_column(c)
    for h in hardware_profiles().values():
        hw.add_row(
            h.id,
            h.name,
            f"{h.memory_gib:.0f} GiB",
            f"{h.hbm_bandwidth_tbs:.2f} TB/s",
            f"{h.peak_tflops.bf16:,.0f} TFLOP/s",
            "-" if h.peak_tflops.fp8 is None else f"{h.peak_tflops.fp8:,.0f} TFLOP/s",
            f"{h.price_per_hour:.2f}",
        )
    resolved: dict[str, object] = {}
    where = ""
    if model and hardware:
        resolved = knob_defaults(get_model(model), get_hardware(hardware))
        where = f" on {model} @ {hardware}"
    knobs = Table(title=f"serving knobs (--set knob=value){where}", title_justify="left")
    knobs.add_column("knob", style="bold")
    knobs.add_column("default")
    knobs.add_column("what it does", overflow="fold")
    for k in KNOBS:
        default = str(resolved[k.name]) if k.name in resolved else k.default
        knobs.add_row(k.name, default, k.help)
    return Group(models, Text(""), hw, Text(""), knobs)
