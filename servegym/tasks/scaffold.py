"""Scaffold a new task folder (``servegym task new``): a commented ``task.toml``, an
``instruction.md`` and an ``oracle.toml`` that validate as written, or a copy of an
existing task with its id rewritten. An existing id is refused."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from servegym.errors import UserError
from servegym.paths import quoted
from servegym.tasks.loader import (
    INSTRUCTION_FILE,
    ORACLE_FILE,
    TASK_FILE,
    resolve_task_folder,
    task_file,
    tasks_dir,
)
from servegym.tasks.spec import MAX_ID_LENGTH

_ID_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")

TEMPLATE_TASK = """\
# A ServeGym task. Fields: docs/adding-a-task.md; knobs and defaults: `servegym sim --list`;
# workloads: `servegym workload list`. Check it with `servegym task validate {id}`.
id = "{id}"                 # must equal the folder name
title = "Offline throughput: Llama-3.1-8B on one H100 (edit me)"
track = "sim"                # sim | cpu | gpu
model = "llama-3.1-8b"       # a model profile (servegym sim --list)
hardware = "h100-sxm"        # a hardware profile; its $/GPU-hour prices cost objectives
# price_per_hour = 3.35      # $ per GPU-hour, to override the hardware profile's
engines = ["sim"]            # a sim task's engines are ["sim"]
# sim_engine = "vllm"        # the engine the simulator models: vllm | tensorrt-llm
tags = ["balanced", "offline", "throughput"]

# The config the submission is compared with: vLLM's defaults unless set here (any
# ServingConfig knob, e.g. tensor_parallel_size = 4 for a model that needs it).
[baseline]

[workload]
name = "balanced"            # a shipped workload, or a .toml path relative to this folder
overrides = []               # dotted key=value, e.g. ["arrival.kind=poisson", "arrival.rate=8"]
requests = 200               # requests (sessions, for agentic); keep an experiment fast
scale = 0.5                  # multiplies every token length
dev_seed = 0                 # the seed agents see; scoring uses a hidden one

# kind: output_throughput | ttft | tpot | itl | e2e | turn_latency (lower is better, with
# statistic = mean | p50 | p90 | p95 | p99) | goodput | max_rate_at_sla | cost_at_sla (need
# [sla]; the rate objectives search a Poisson rate in [rate_min, rate_max]) | composite
# (geometric mean of [[objective.components]]).
[objective]
kind = "output_throughput"

# [sla]                      # per-request objectives in ms (goodput and rate objectives)
# ttft_ms = 500
# tpot_ms = 50

[accuracy]
min_ratio = 0.98             # modelled accuracy vs the baseline's: fp8 0.997, int8 0.985, int4 0.97

[budget]
sim_gpu_seconds = 6000       # each experiment: (start-up + simulated run) x GPUs
max_experiments = 100

[evaluation]
repeats = 5                  # paired baseline/submission runs on the hidden workload (>= 5)
oracle_min_score = 1.2       # oracle.toml must score at least this
nop_tolerance = 0.05         # the baseline must score 1.0 within this
"""

TEMPLATE_INSTRUCTION = """\
You are the serving engineer for this deployment. The environment describes the model, the
hardware, the workload, the serving knobs and their defaults, the objective and your budget.

Find the serving configuration that does best on the objective, then submit it. Every
experiment costs budget (simulated GPU time, more for more GPUs); when it runs out, your last
submission stands.

Rules: serve the given model. Quantizing it (weights or KV cache) is allowed, but the
submission must keep at least the stated fraction of the baseline's accuracy. No other model
may answer the requests (a draft model for speculative decoding is fine).
"""

TEMPLATE_ORACLE = """\
# The expert ("oracle") config, never shown to agents: a ServingConfig (knobs at the top
# level, [speculative] as a table). `servegym task validate` checks it scores at least
# evaluation.oracle_min_score. Say why it should win; try it with
#   servegym sim --model ... --hardware ... --workload ... --config tasks/<id>/oracle.toml
quantization = "fp8"          # FP8 weights: FP8 tensor cores, half the weight bytes
kv_cache_dtype = "fp8"        # twice the tokens in the KV cache: larger batches
max_num_batched_tokens = 16384
"""


def new_task(task_id: str, from_: str | None = None, root: Path | None = None) -> tuple[Path, str]:
    """Scaffold ``tasks/<task_id>/`` (from the template, or a copy of ``from_``); returns
    the folder and how it was made (``from the template``, ``copied from ID``)."""
    if len(task_id) > MAX_ID_LENGTH:
        raise UserError(
            f"task new: bad id '{quoted(task_id)}': at most {MAX_ID_LENGTH} characters "
            "(it names the task's folder)"
        )
    if not _ID_RE.match(task_id):
        raise UserError(
            f"task new: bad id '{task_id}': use lowercase letters, digits, '.', '_' and '-', "
            "starting with a letter or digit"
        )
    base = root if root is not None else tasks_dir()
    folder = base / task_id
    if folder.exists():
        raise UserError(f"task new: '{task_id}' exists already ({folder}); pick another id")
    if from_ is not None:
        source = resolve_task_folder(from_, root, flag="--from")
        # Every file copied must lie inside the source task: a symlink out is refused
        # (copying would follow it and write what it points at into the new task).
        source_file = task_file(source, TASK_FILE)
        try:
            text = source_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(f"{source_file}: cannot read ({e})") from None
        new_text, n = re.subn(
            r'^(\s*id\s*=\s*)(["\']).*?\2', rf'\g<1>"{task_id}"', text, count=1, flags=re.M
        )
        if n == 0:
            raise UserError(f"{source / TASK_FILE}: no 'id = \"...\"' line to rewrite")
        copies = [
            task_file(source, extra.name)
            for extra in sorted(source.iterdir())
            if extra.name != TASK_FILE and extra.is_file()
        ]
        folder.mkdir(parents=True)
        (folder / TASK_FILE).write_text(new_text, encoding="utf-8")
        for extra in copies:
            shutil.copyfile(extra, folder / extra.name)
        made = f"copied from {source.name}"
    else:
        folder.mkdir(parents=True)
        (folder / TASK_FILE).write_text(TEMPLATE_TASK.format(id=task_id), encoding="utf-8")
        (folder / INSTRUCTION_FILE).write_text(TEMPLATE_INSTRUCTION, encoding="utf-8")
        (folder / ORACLE_FILE).write_text(TEMPLATE_ORACLE, encoding="utf-8")
        made = "from the template"
    return folder, made
