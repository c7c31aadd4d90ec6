"""The ``checklist`` baseline on the fake TaskEnvironment of the baseline tests: it tries each
generic move alone, combines the ones that helped greedily, honours the accuracy gate and
the budget, and never varies with the seed. On the simulator it runs a whole trial."""

from __future__ import annotations

from pathlib import Path

from test_agents_baselines import ACCURACY, FakeEnv

from servegym.agents.base import agent_names, make_agent
from servegym.agents.checklist import ChecklistAgent, Move, effective_baseline, moves
from servegym.agents.search_space import SearchSpace, load_search_space
from servegym.engines.config import ServingConfig
from servegym.runner.trial import run_trial

TASKS = Path(__file__).parent / "data" / "tasks"


def test_checklist_is_registered() -> None:
    assert "checklist" in agent_names()
    assert isinstance(make_agent("checklist"), ChecklistAgent)


def test_moves_follow_the_space_and_skip_what_the_baseline_already_has() -> None:
    space = load_search_space("sim", model="llama-3.1-8b", num_gpus=4)
    names = [m.name for m in moves(space, {"quantization": "none", "tensor_parallel_size": 1})]
    assert names == [
        "quantized weights",
        "fp8 KV cache",
        "prefix caching",
        "chunked prefill",
        "speculation",
        "larger batch limits",
        "tensor parallelism",
    ]
    by_name = {m.name: m for m in moves(space, {"tensor_parallel_size": 2})}
    assert [o["tensor_parallel_size"] for o in by_name["tensor parallelism"].options] == [4]
    assert {o["quantization"] for o in by_name["quantized weights"].options} == {
        "fp8",
        "int8",
        "int4",
    }
    # Prefix caching already on (the baseline or the engine default): not a move.
    on = moves(space, {"enable_prefix_caching": True, "enable_chunked_prefill": True})
    assert "prefix caching" not in [m.name for m in on]


def test_checklist_combines_what_helped_and_respects_the_gate() -> None:
    env = FakeEnv(budget=60)
    agent = ChecklistAgent()
    agent.run(env, seed=0)
    assert env.measured[0][0] == env.baseline
    final = env.submissions[-1]
    # fp8 weights (int4 is faster but below the 0.99 accuracy gate) with an fp8 KV cache.
    assert final.quantization == "fp8" and final.kv_cache_dtype == "fp8"
    assert ACCURACY[final.quantization] >= env.accuracy_min_ratio
    assert {"quantized weights", "fp8 KV cache"} <= set(agent.kept)
    # Every kept move helped: the combination beats each of its parts alone.
    parts = ServingConfig(quantization="fp8", kv_cache_dtype="fp8")
    assert env.objective(final) >= env.objective(parts)
    assert env.objective(final) > env.baseline_value * 1.8


def test_checklist_is_deterministic_and_stops_on_the_budget() -> None:
    a, b = FakeEnv(budget=60), FakeEnv(budget=60)
    ChecklistAgent().run(a, seed=0)
    ChecklistAgent().run(b, seed=7)
    assert [c for c, _ in a.measured] == [c for c, _ in b.measured]
    short = FakeEnv(budget=3)
    ChecklistAgent().run(short, seed=0)
    assert len(short.measured) == 3 and short.exhausted_calls == 1
    assert short.submissions[-1] == short.best_legal()[0]


def test_a_variant_adds_its_own_moves() -> None:
    """``checklist_moves`` is where a variant (``benchmarks/checklist_threat.py``) adds a
    move: it is measured like the others; the checklist itself never tries it."""

    class SmallerBudget(ChecklistAgent):
        def checklist_moves(self, space: SearchSpace) -> list[Move]:
            option = {"enable_chunked_prefill": True, "max_num_batched_tokens": 384}
            return [*super().checklist_moves(space), Move("smaller step budget", (option,))]

    plain, variant = FakeEnv(budget=60), FakeEnv(budget=60)
    ChecklistAgent().run(plain, seed=0)
    SmallerBudget().run(variant, seed=0)
    assert all(c.max_num_batched_tokens != 384 for c, _ in plain.measured)
    assert any(c.max_num_batched_tokens == 384 for c, _ in variant.measured)


def test_effective_baseline_reads_engine_defaults() -> None:
    env = FakeEnv(baseline=ServingConfig(max_num_seqs=64))
    base = effective_baseline(env.describe())
    assert base["max_num_seqs"] == 64


def test_checklist_runs_a_sim_trial(tmp_path: Path) -> None:
    result = run_trial("tiny-throughput", "checklist", 0, tmp_path, tasks_root=TASKS)
    assert result.outcome == "scored" and result.score is not None
    assert result.process is not None and result.process.experiments >= 2
