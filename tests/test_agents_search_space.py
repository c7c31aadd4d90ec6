"""The search-space data of the search baselines: loading, validation errors, sampling (legal
combinations only, deterministic by seed), model-specific presets, Optuna suggestions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import optuna
import pytest

from servegym.agents.search_space import (
    SPECULATIVE_OFF,
    IllegalConfig,
    SearchSpace,
    load_search_space,
    read_search_space,
    search_spaces_dir,
)
from servegym.engines.config import ServingConfig
from servegym.engines.sim.launch import LaunchError, launch
from servegym.errors import UserError

SIM = search_spaces_dir() / "sim.toml"


@pytest.fixture(scope="module")
def space() -> SearchSpace:
    return load_search_space("sim", model="llama-3.1-8b", num_gpus=8)


def test_shipped_sim_space_loads(space: SearchSpace) -> None:
    assert SIM.is_file()
    assert {"max_num_seqs", "max_num_batched_tokens", "quantization", "speculative"} <= set(
        space.names
    )
    assert space.spec.forbidden, "the sim space names at least one illegal combination"
    # Every knob of the space is a ServingConfig field.
    assert set(space.names) <= set(ServingConfig.model_fields)


def test_sampling_is_legal_and_deterministic(space: SearchSpace) -> None:
    base = ServingConfig()
    a = [space.sample_config(np.random.default_rng(7), base) for _ in range(1)]
    rng1, rng2 = np.random.default_rng(123), np.random.default_rng(123)
    draws1 = [space.sample_config(rng1, base) for _ in range(300)]
    draws2 = [space.sample_config(rng2, base) for _ in range(300)]
    assert [p for p, _ in draws1] == [p for p, _ in draws2]
    assert a[0][0] == space.sample_config(np.random.default_rng(7), base)[0]
    other = [space.sample_config(np.random.default_rng(124), base)[0] for _ in range(5)]
    assert other != [p for p, _ in draws1[:5]]
    for params, config in draws1:
        assert space.forbidden_by(params) is None
        assert ServingConfig.model_validate(config.model_dump()) == config
        assert config.max_num_seqs is not None and 8 <= config.max_num_seqs <= 1024
        batched = config.max_num_batched_tokens
        if batched is not None:
            assert batched >= config.max_num_seqs  # the forbidden clause holds
        # the conditional knob: only tuned with chunked prefill on
        if config.enable_chunked_prefill is False:
            assert "max_num_batched_tokens" not in params
        gmu = config.gpu_memory_utilization
        assert gmu is not None and 0.5 <= gmu <= 0.97
        assert round(gmu, 2) == gmu  # the 0.01 grid


def test_sampling_covers_choices(space: SearchSpace) -> None:
    rng = np.random.default_rng(0)
    seen = {space.sample(rng)["speculative"] for _ in range(400)}
    assert seen == set(space.knobs["speculative"].choices or [])


def test_raw_draws_can_be_forbidden_and_to_config_refuses_them(space: SearchSpace) -> None:
    params = space.sample(np.random.default_rng(1))
    params.update(enable_chunked_prefill=True, max_num_seqs=512, max_num_batched_tokens=256)
    with pytest.raises(IllegalConfig, match="forbidden"):
        space.to_config(params, ServingConfig())


def test_to_config_lays_draws_over_the_baseline(space: SearchSpace) -> None:
    base = ServingConfig(max_model_len=16384, tensor_parallel_size=2)
    params = {"quantization": "fp8", "speculative": SPECULATIVE_OFF}
    config = space.to_config(params, base)
    assert config.max_model_len == 16384 and config.tensor_parallel_size == 2
    assert config.quantization == "fp8" and config.speculative is None


def test_presets_follow_the_model() -> None:
    llama = load_search_space("sim", model="llama-3.1-8b")
    mistral = load_search_space("sim", model="mistral-7b-v0.3")
    qwen = load_search_space("sim", model="qwen3-8b")
    assert "draft-k3" in llama.presets and "eagle-k3" in llama.presets
    assert llama.presets["draft-k3"].draft_model == "llama-3.2-1b"
    # Mistral has no draft model and no EAGLE head in the simulator: only n-gram remains.
    assert set(mistral.knobs["speculative"].choices or []) == {"off", "ngram-k2", "ngram-k4"}
    assert "eagle-k3" not in qwen.presets and qwen.presets["draft-k3"].draft_model == "qwen3-0.6b"


@pytest.mark.parametrize("model", ["llama-3.1-8b", "qwen3-8b", "mistral-7b-v0.3"])
def test_every_available_preset_launches(model: str) -> None:
    space = load_search_space("sim", model=model)
    for name, preset in space.presets.items():
        try:
            launch(model, "h100-sxm", ServingConfig(speculative=preset))
        except LaunchError as e:  # pragma: no cover - the failure message is the point
            pytest.fail(f"preset {name} on {model}: {e}")


def test_tensor_parallel_choices_follow_the_gpus() -> None:
    one = load_search_space("sim", model="llama-3.1-8b", num_gpus=1)
    four = load_search_space("sim", model="llama-3.1-8b", num_gpus=4)
    assert one.knobs["tensor_parallel_size"].choices == [1]
    assert four.knobs["tensor_parallel_size"].choices == [1, 2, 4]


def test_optuna_suggestions_are_in_the_space(space: SearchSpace) -> None:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    legal = 0
    for _ in range(50):
        trial = study.ask()
        params = space.suggest(trial)
        assert set(params) <= set(space.names)
        try:
            config = space.to_config(params, ServingConfig())
        except IllegalConfig:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            continue
        legal += 1
        assert config.max_num_seqs is not None
        study.tell(trial, 1.0)
    assert legal > 25


BAD_SPACES = {
    "not a knob": ('[knobs.warp_speed]\nkind = "int"\nlow = 1\nhigh = 2\n', "warp_speed"),
    "bad range": ('[knobs.max_num_seqs]\nkind = "int"\nlow = 8\nhigh = 4\n', "low"),
    "late condition": (
        '[knobs.max_num_batched_tokens]\nkind = "int"\nlow = 1\nhigh = 9\n'
        "when = { enable_chunked_prefill = true }\n"
        '[knobs.enable_chunked_prefill]\nkind = "categorical"\nchoices = [true, false]\n',
        "listed before",
    ),
    "unknown preset": (
        '[knobs.speculative]\nkind = "categorical"\nchoices = ["off", "warp"]\n',
        "warp",
    ),
    "unknown placeholder": (
        '[knobs.speculative]\nkind = "categorical"\nchoices = ["off", "x"]\n'
        '[speculative_presets.x]\nmethod = "eagle"\nnum_speculative_tokens = 2\n'
        'draft_model = "{mystery}"\n',
        "mystery",
    ),
    "forbidden unknown knob": (
        '[knobs.max_num_seqs]\nkind = "int"\nlow = 8\nhigh = 64\n'
        '[[forbidden]]\nrelation = "max_num_seqs > block_size"\n',
        "block_size",
    ),
    "bad relation": (
        '[knobs.max_num_seqs]\nkind = "int"\nlow = 8\nhigh = 64\n'
        '[[forbidden]]\nrelation = "max_num_seqs is big"\n',
        "relation",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_SPACES))
def test_bad_space_files_are_one_line_errors(case: str, tmp_path: Path) -> None:
    body, needle = BAD_SPACES[case]
    path = tmp_path / "bad.toml"
    path.write_text('engine = "sim"\n' + body)
    with pytest.raises(UserError) as info:
        read_search_space(path)
    message = info.value.message
    assert str(path) in message and needle in message and "\n" not in message


def test_malformed_and_missing_space_files(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text('engine = "sim\n')
    with pytest.raises(UserError, match="malformed TOML"):
        read_search_space(path)
    with pytest.raises(UserError, match="no search space for engine 'warp'"):
        load_search_space("warp")
