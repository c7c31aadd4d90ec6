"""The shipped task suite: every task loads and validates its schema, its oracle parses as a
ServingConfig, and together the tasks cover what the suite promises (workload families,
objectives, models, hardware, the 70B task and a strict accuracy gate), and every oracle needs
more than the generic wins of the ``checklist`` agent. The nop and oracle checks themselves
run in ``servegym task validate`` (and, for one small task, in test_tasks_commands.py)."""

from __future__ import annotations

from collections import Counter

import pytest

from servegym.engines.config import ServingConfig
from servegym.engines.sim.profiles import quantization_profiles
from servegym.tasks.loader import LoadedTask, load_task_folder, task_folders, workload_spec
from servegym.workloads.spec import WorkloadSpec

FOLDERS = task_folders()


@pytest.fixture(scope="module")
def suite() -> list[tuple[LoadedTask, WorkloadSpec]]:
    """The sim tasks (the suite's coverage promises are about them)."""
    out = []
    for folder in FOLDERS:
        loaded = load_task_folder(folder)
        if loaded.task.track != "sim":
            continue
        spec, _ = workload_spec(loaded)
        out.append((loaded, spec))
    return out


@pytest.mark.parametrize("folder", FOLDERS, ids=[f.name for f in FOLDERS])
def test_task_loads_with_instruction_and_oracle(folder: object) -> None:
    loaded = load_task_folder(folder)  # type: ignore[arg-type]
    assert loaded.id == loaded.path.name
    assert isinstance(loaded.oracle, ServingConfig), "every shipped task has an oracle.toml"
    assert loaded.oracle != loaded.task.baseline
    assert len(loaded.instruction.split()) > 40
    assert "oracle" not in loaded.instruction.lower()
    task = loaded.task
    if task.track == "sim":
        assert task.budget.sim_gpu_seconds is not None
    else:
        assert task.budget.wall_seconds is not None and task.price_per_hour is not None
    assert task.budget.max_experiments is not None
    assert task.evaluation.oracle_min_score >= 1.2


def _kinds(loaded: LoadedTask) -> set[str]:
    """The objective's kind and its components' kinds."""
    obj = loaded.task.objective
    return {obj.kind} | {c.kind for c in obj.components}


def test_suite_size_and_coverage(suite: list[tuple[LoadedTask, WorkloadSpec]]) -> None:
    tasks = [loaded.task for loaded, _ in suite]
    assert len(tasks) >= 20
    assert len({t.model for t in tasks}) >= 4
    assert len({t.hardware for t in tasks}) >= 5
    families = Counter(t.workload.name for t in tasks)
    assert {"prefill-heavy", "balanced", "agentic", "trace"} <= set(families)
    kinds = set().union(*(_kinds(loaded) for loaded, _ in suite))
    assert {
        "ttft",
        "itl",
        "e2e",
        "turn_latency",
        "goodput",
        "cost_at_sla",
        "composite",
        "pipeline_rate",
        "pipeline_latency",
    } <= kinds
    arrivals = {spec.arrival.kind for _, spec in suite}
    assert {"offline", "poisson", "concurrency", "trace"} <= arrivals
    # tail latency under Poisson load
    assert any(
        c.kind in ("ttft", "e2e") and c.statistic == "p99"
        for t, (_, spec) in zip(tasks, suite, strict=True)
        for c in [t.objective, *t.objective.components]
        if spec.arrival.kind == "poisson"
    )


def test_every_sim_oracle_goes_beyond_the_checklist(
    suite: list[tuple[LoadedTask, WorkloadSpec]],
) -> None:
    """The suite measures reasoning: every oracle sets something the ``checklist`` agent never
    tries (it only adds generic wins: quantization, fp8 KV, switches on, speculation, larger
    batch limits, more GPUs). Each oracle lowers the step budget below vLLM's smaller default
    (2,048), schedules by priority, uses fewer GPUs than the baseline, or tunes a pipeline."""
    for loaded, _ in suite:
        oracle, base = loaded.oracle, loaded.task.baseline
        assert oracle is not None
        beyond = [
            (oracle.max_num_batched_tokens or 8192) < 2048,
            oracle.scheduling_policy == "priority",
            (oracle.tensor_parallel_size or 1) < (base.tensor_parallel_size or 1),
            oracle.pipeline is not None,
        ]
        assert any(beyond), loaded.id


def test_a_70b_task_trades_tensor_parallelism_against_cost(
    suite: list[tuple[LoadedTask, WorkloadSpec]],
) -> None:
    big = [loaded for loaded, _ in suite if loaded.task.model == "llama-3.1-70b"]
    assert big
    for loaded in big:
        obj = loaded.task.objective
        kinds = {obj.kind} | {c.kind for c in obj.components}
        assert "cost_at_sla" in kinds  # more GPUs cost more
        assert (loaded.task.baseline.tensor_parallel_size or 1) > 1  # BF16 70B needs several
    tp = {(loaded.oracle.tensor_parallel_size or 1) for loaded in big if loaded.oracle}
    base = {loaded.task.baseline.tensor_parallel_size or 1 for loaded in big}
    assert tp - base, "some 70B oracle uses another tensor-parallel size than its baseline"


def test_an_int4_trap_task_gates_int4_but_not_fp8(
    suite: list[tuple[LoadedTask, WorkloadSpec]],
) -> None:
    q = quantization_profiles()
    int4, fp8 = q["int4"].accuracy_ratio, q["fp8"].accuracy_ratio
    kv_fp8 = q["kv_fp8"].accuracy_ratio
    int8 = q["int8"].accuracy_ratio
    # A strict gate: int4 and int8 fail it, fp8 passes.
    traps = [
        loaded for loaded, _ in suite if max(int4, int8) < loaded.task.accuracy.min_ratio <= fp8
    ]
    assert traps
    for loaded in traps:
        oracle = loaded.oracle
        assert oracle is not None and oracle.quantization == "fp8"
        kv = kv_fp8 if (oracle.kv_cache_dtype or "auto").startswith("fp8") else 1.0
        assert fp8 * kv >= loaded.task.accuracy.min_ratio


def test_workloads_are_small(suite: list[tuple[LoadedTask, WorkloadSpec]]) -> None:
    """Each experiment must simulate quickly: bounded request counts and token lengths."""
    for loaded, spec in suite:
        assert spec.num_requests <= 400, loaded.id
        if spec.kind == "synthetic":
            assert spec.scale <= 0.5, loaded.id


def test_cpu_tasks_fit_the_cpu_track() -> None:
    """Three cpu-track tasks, each on servegym-tiny with prompts inside its vocabulary and
    context, each with an oracle that changes what the track rewards."""
    from servegym.engines.cpu_home import TINY_MODEL

    cpu = [load_task_folder(f) for f in FOLDERS]
    cpu = [lo for lo in cpu if lo.task.track == "cpu"]
    assert len(cpu) >= 3
    for loaded in cpu:
        task = loaded.task
        assert task.model == TINY_MODEL and task.engines == ["vllm-cpu"]
        if task.pipeline is None:  # a pipeline task sends its own questions, not these prompts
            spec, _ = workload_spec(loaded)
            assert spec.prompt.token_id_high <= 4096 and spec.prompt.token_id_low >= 5
            longest = spec.input_tokens.max or spec.input_tokens.value
            assert longest is not None and longest * spec.scale + 64 <= 4096
        assert task.evaluation.repeats >= 5
        assert loaded.oracle is not None and loaded.oracle != task.baseline
