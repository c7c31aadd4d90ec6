"""One CPU pipeline run against running LLM servers, for a person at a terminal::

    python -m servegym.pipeline.cpu --base-url http://127.0.0.1:8000 [--grade-url URL]
        [--questions N] [--seed S] [--modules-every N] [--set knob=value ...]
        [--backend minilm|hash] [--out DIR]

It builds the corpus, starts the retrieval worker (the CPU track's environment for
``minilm``; this Python for ``hash``), runs the questions and writes ``pipeline.json`` (the
shared :class:`~servegym.pipeline.result.PipelineResult`) and ``cpu-pipeline.json`` (with the
build, knobs and per-question retrieval) to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from servegym.engines.pipeline_knobs import PipelineKnobs
from servegym.errors import UserError
from servegym.overrides import parse_value
from servegym.pipeline.cpu.corpus import MODULES, build_corpus, make_questions
from servegym.pipeline.cpu.retrieval import WorkerRetriever
from servegym.pipeline.cpu.runner import CpuPipelineRun, PipelineSettings, run_pipeline


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m servegym.pipeline.cpu", description=__doc__)
    p.add_argument("--base-url", required=True, help="the answer LLM server")
    p.add_argument("--grade-url", help="the grader's server (with --set grade_server=dedicated)")
    p.add_argument("--model", default="servegym-tiny")
    p.add_argument("--questions", type=int, default=24)
    p.add_argument("--passages-kept", type=int, default=4, help="k of recall@k")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--modules-every", type=int, default=1, help="use every Nth module")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KNOB=VALUE")
    p.add_argument("--backend", choices=("minilm", "hash"), default="minilm")
    p.add_argument("--out", type=Path, default=Path("runs/pipeline-cpu"))
    return p


async def _run(args: argparse.Namespace) -> CpuPipelineRun:
    table: dict[str, object] = {}
    for item in args.sets:
        key, sep, value = item.partition("=")
        if not sep:
            raise UserError(f"--set {item}: expected KNOB=VALUE")
        table[key.strip()] = parse_value(value)
    try:
        knobs = PipelineKnobs.model_validate(table)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise UserError(f"--set {where}: {first['msg']}") from None
    if args.modules_every < 1:
        raise UserError("--modules-every: must be >= 1")
    corpus = build_corpus(MODULES[:: args.modules_every])
    try:
        questions = make_questions(corpus, args.questions, args.seed)
    except ValueError as exc:
        raise UserError(f"--questions: {exc}") from None
    settings = PipelineSettings(
        answer_url=args.base_url, grade_url=args.grade_url, model=args.model
    )
    python = sys.executable if args.backend == "hash" else None
    args.out.mkdir(parents=True, exist_ok=True)
    async with await WorkerRetriever.start(
        python, backend=args.backend, stderr=args.out / "worker.log"
    ) as worker:
        return await run_pipeline(corpus, questions, worker, knobs, settings)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        run = asyncio.run(_run(args))
    except UserError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return exc.exit_code
    run.result.write(args.out / "pipeline.json")
    (args.out / "cpu-pipeline.json").write_text(run.model_dump_json(indent=2) + "\n")
    r = run.result
    print(f"corpus {run.build.docs} passages ({run.corpus_digest[:12]}), {len(r.tasks)} questions")
    print(f"index build {r.index_build_docs_per_s:.1f} docs/s", end="; ")
    print(f"answering {r.answering_tasks_per_s:.2f} tasks/s")
    lat = r.latency_s
    print(f"latency p50 {lat.p50:.2f} s, p90 {lat.p90:.2f} s, p99 {lat.p99:.2f} s")
    print(f"recall@{r.k} {r.recall_at_k:.3f}; rounds {sum(t.rounds for t in r.tasks)}")
    for stage, share in r.stage_shares().items():
        print(f"  {stage:<10} {r.stage_totals_s[stage]:8.2f} s  {share:6.1%}")
    print(f"wrote {args.out / 'pipeline.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
