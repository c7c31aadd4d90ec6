"""Worker for ``guidellm run``, run with the Python of an environment that has guidellm.

Each job is one ``guidellm run`` invocation, made in-process through guidellm's Click
command (``cli.main(args=..., standalone_mode=False)``), so the interpreter and imports are
paid once; guidellm still starts its own worker processes for every run, as its command
does. The run: the ``openai_http`` backend on ``/v1/completions``, the ``constant`` profile
at rate ``R``, a ``max_requests`` constraint of ``N``, ``synthetic_text`` data at fixed
lengths, the given local tokenizer, and a JSON report whose request counts are returned.
guidellm's own defaults (worker processes, HTTP client) are left as they are; set
``GUIDELLM__*`` environment variables to change them. See ``_worker_common.py``.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from _worker_common import Handler, Job, Reply, dist_version, serve


def setup(cfg: dict[str, Any]) -> tuple[dict[str, Any], Handler]:
    from guidellm.__main__ import cli

    workdir = Path(tempfile.mkdtemp(prefix="guidellm-worker-"))
    os.chdir(workdir)

    def handle(job: Job) -> Reply:
        report = workdir / f"run-{job['seed']}.json"
        backend = (
            f"kind=openai_http,target={cfg['base_url']},model={cfg['model']},"
            "request_format=/v1/completions"
        )
        data = (
            f"kind=synthetic_text,prompt_tokens={cfg['input_tokens']},"
            f"output_tokens={cfg['output_tokens']}"
        )
        argv = [
            "run",
            "--backend", backend,
            "--profile", f"kind=constant,rate={float(job['rate'])!r}",
            "--constraint", f"kind=max_requests,count={int(job['num_requests'])}",
            "--tokenizer", f"kind=hf_auto,model={cfg['tokenizer']}",
            "--data", data,
            "--seed", f"kind=static,value={int(job['seed'])}",
            "--output", f"kind=json,path={report}",
            "--disable-console",
        ]  # fmt: skip
        cli.main(args=argv, standalone_mode=False)
        doc = json.loads(report.read_text())
        report.unlink()
        made = doc["benchmarks"][-1]["scheduler_metrics"]["requests_made"]
        return {
            "completed": int(made.get("successful", 0)),
            "failed": int(made.get("errored", 0)) + int(made.get("incomplete", 0)),
            "argv": argv,
        }

    return {"version": dist_version("guidellm")}, handle


if __name__ == "__main__":  # guidellm's worker processes are spawned: keep this guard
    serve(setup)
