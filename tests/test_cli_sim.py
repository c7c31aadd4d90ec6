"""``servegym sim`` end to end, as a user runs it: outputs, determinism, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SMALL = ["--workload", "balanced", "--requests", "40", "--scale", "0.2"]


def servegym(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "servegym", *args], capture_output=True, text=True, timeout=120
    )


def sim(out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return servegym(
        "sim", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", *SMALL,
        "--out", str(out), *extra,
    )  # fmt: skip


def test_sim_writes_the_bench_files_plus_sim_json(tmp_path: Path) -> None:
    proc = sim(tmp_path / "a")
    assert proc.returncode == 0, proc.stderr
    files = {p.name for p in (tmp_path / "a").iterdir()}
    assert {"run.json", "requests.jsonl", "metrics.json", "sim.json"} <= files
    metrics = json.loads((tmp_path / "a" / "metrics.json").read_text())
    assert metrics["completed"] == 40 and metrics["failed"] == 0
    assert metrics["cost_per_mtok"] > 0
    stats = json.loads((tmp_path / "a" / "sim.json").read_text())
    for key in ("kv_capacity_tokens", "preemptions", "prefix_cache_hit_rate",
                "mean_batch_size", "startup_s"):  # fmt: skip
        assert key in stats
    lines = (tmp_path / "a" / "requests.jsonl").read_text().splitlines()
    assert (
        len(lines)
        == 40 + json.loads((tmp_path / "a" / "metrics.json").read_text())["warmup_requests"]
    )


def test_same_seed_gives_identical_metrics_json(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for out, seed in ((a, "3"), (b, "3"), (c, "4")):
        proc = sim(out, "--seed", seed)
        assert proc.returncode == 0, proc.stderr
    assert (a / "metrics.json").read_bytes() == (b / "metrics.json").read_bytes()
    assert (a / "requests.jsonl").read_bytes() == (b / "requests.jsonl").read_bytes()
    assert (a / "metrics.json").read_bytes() != (c / "metrics.json").read_bytes()


def test_knobs_from_set_and_config_file(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg.toml"
    cfg.write_text("max_num_seqs = 8\nkv_cache_dtype = 'fp8'\n")
    proc = sim(tmp_path / "a", "--config", str(cfg), "--set", "enable_prefix_caching=false")
    assert proc.returncode == 0, proc.stderr
    stats = json.loads((tmp_path / "a" / "sim.json").read_text())
    assert stats["config"]["max_num_seqs"] == 8
    assert stats["config"]["kv_cache_dtype"] == "fp8"
    assert stats["config"]["enable_prefix_caching"] is False


def test_launch_failure_exits_3_with_an_engine_like_message(tmp_path: Path) -> None:
    proc = servegym(
        "sim", "--model", "llama-3.1-70b", "--hardware", "h100-sxm", *SMALL,
        "--out", str(tmp_path / "a"),
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "launch failed" in proc.stderr and "memory" in proc.stderr.lower()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--model", "gpt-9"], "--model"),
        (["--hardware", "tpu"], "--hardware"),
        (["--set", "max_num_seqs=0"], "max_num_seqs"),
        (["--set", "warp_speed=1"], "warp_speed"),
        (["--config", "/nonexistent/cfg.toml"], "--config"),
        (["--workload-set", "arrival.rate=-2"], "arrival.rate"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], needle: str) -> None:
    base = {"--model": "llama-3.1-8b", "--hardware": "h100-sxm"}
    for flag in ("--model", "--hardware"):
        if flag in args:
            base[flag] = args[args.index(flag) + 1]
    rest = [a for i, a in enumerate(args) if a not in base and (i == 0 or args[i - 1] not in base)]
    proc = servegym(
        "sim", "--model", base["--model"], "--hardware", base["--hardware"], *SMALL,
        "--out", str(tmp_path / "a"), *rest,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert needle in proc.stderr


def test_list_shows_models_hardware_and_knob_defaults() -> None:
    proc = servegym("sim", "--list", "--model", "llama-3.1-8b", "--hardware", "h100-sxm")
    assert proc.returncode == 0, proc.stderr
    for word in ("llama-3.1-70b", "h200", "l40s", "max_num_seqs", "kv_cache_dtype", "1024"):
        assert word in proc.stdout
