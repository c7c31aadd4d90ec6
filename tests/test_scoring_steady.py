"""Steady state: the backlog check on synthetic records, and a credited rate that holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from servegym.engines.config import ServingConfig
from servegym.engines.sim.engine import simulate
from servegym.engines.sim.launch import launch
from servegym.loadgen.records import RequestRecord
from servegym.scoring.steady import backlog_growth, served_rate
from servegym.tasks.loader import load_task, workload_spec
from servegym.tracks.sim_measure import measure_objective, steady_spec
from servegym.workloads.generate import materialise

TASKS = Path(__file__).parent / "data" / "tasks"
S = 1_000_000_000


def _records(n: int, per_s: float, service_s: float, served: float) -> list[RequestRecord]:
    """``n`` arrivals at ``per_s``; a server that finishes ``served`` of them per arrival
    (one at a time, each after the previous, never before its own arrival + service)."""
    out: list[RequestRecord] = []
    free = 0.0
    for i in range(n):
        t = i / per_s
        free = max(free + 1 / (per_s * served), t + service_s)
        out.append(
            RequestRecord(
                request_id=str(i),
                session_id=i,
                turn_index=0,
                prompt_tokens=1,
                expected_output_tokens=1,
                scheduled_ns=round(t * S),
                sent_ns=round(t * S),
                first_token_ns=round(free * S),
                done_ns=round(free * S),
                end_ns=round(free * S),
            )
        )
    return out


def test_backlog_growth_reads_the_share_of_arrivals_not_served() -> None:
    steady, _ = backlog_growth(_records(2000, 20.0, 0.5, 1.0), start_ns=10 * S)
    assert abs(steady) < 0.01
    half, _ = backlog_growth(_records(2000, 20.0, 0.5, 0.5), start_ns=10 * S)
    assert half == pytest.approx(0.5, abs=0.03)
    assert backlog_growth([], start_ns=0) == (0.0, 0.0)


def test_served_rate_counts_the_second_half_after_the_fill() -> None:
    """A server that keeps up serves the arrival rate once filled, though each request
    spends 5 s in it (counted from the first arrival, the fill would read as 0.95 of it);
    one that serves half its arrivals is read at about half."""
    assert served_rate(_records(2000, 20.0, 5.0, 1.0)) == pytest.approx(20.0, rel=0.02)
    assert served_rate(_records(2000, 20.0, 0.5, 0.5)) == pytest.approx(10.0, rel=0.05)
    assert served_rate([]) == 0.0


def test_a_credited_rate_is_delivered_over_a_long_steady_run() -> None:
    """A config credited with rate R serves at least 0.97 R over twice the probe's length
    on another sample (the property the steady window and the backlog check exist for),
    counted over the second half, once the batch has filled."""
    loaded = load_task("tiny-maxrate", TASKS)
    spec, _ = workload_spec(loaded)
    engine = launch(loaded.task.model, loaded.task.hardware, ServingConfig())
    m = measure_objective(loaded.task, engine, spec, 5, 11)
    assert m.rate is not None and m.value == m.rate
    assert all(p.kept_up is not None for p in m.rate_probes)
    n = 2 * loaded.task.objective.rate_requests
    run = simulate(engine, materialise(steady_spec(spec, m.rate, n), 99), noise_seed=99)
    assert served_rate(run.records) >= 0.97 * m.rate
