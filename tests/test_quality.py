"""The quality set (:mod:`servegym.scoring.quality`): generated questions with exact gold
answers, graded after normalisation, asked of scripted OpenAI-compatible servers that
answer rightly and wrongly (:mod:`servegym.tracks.quality`), and folded into the accuracy
gate of a real-track evaluation."""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from engine_support import StandInEngine

from servegym.engines.base import ModelRef
from servegym.engines.config import ServingConfig
from servegym.runner.evaluation import evaluate
from servegym.scoring.gates import GateResult
from servegym.scoring.quality import (
    KINDS,
    QUALITY_SIZE,
    QualityItem,
    check_quality,
    combine,
    grade,
    normalise,
    quality_set,
)
from servegym.tasks.loader import load_task_folder
from servegym.tracks import track_for
from servegym.tracks.quality import QualityCheck, ask_quality_set, quality_off_reason

DATA = Path(__file__).parent / "data" / "tasks"
MODEL = ModelRef(path="mock", served_name="mock")


def _solve(item: QualityItem) -> str:
    """Each question answered from its own text, independently of the generator."""
    p = item.prompt
    if item.kind == "arithmetic":
        m = re.search(r"What is (\d+) ([-+*]) (\d+)\?", p)
        assert m is not None
        a, op, b = int(m[1]), m[2], int(m[3])
        return str(a + b if op == "+" else a - b if op == "-" else a * b)
    if item.kind == "ordering":
        m = re.search(r"largest: ([\d, ]+)\.", p)
        assert m is not None
        return ", ".join(str(n) for n in sorted(int(x) for x in m[1].split(",")))
    if item.kind == "copying":
        m = re.search(r"exactly: (\S+)\. Answer", p)
        assert m is not None
        return m[1]
    m = re.search(r"What date is (\d+) days after (\d{4}-\d\d-\d\d)\?", p)
    assert m is not None
    start = datetime.date.fromisoformat(m[2])
    return (start + datetime.timedelta(days=int(m[1]))).isoformat()


def test_the_set_is_generated_from_a_seed_with_exact_gold_answers() -> None:
    items = quality_set()
    assert len(items) == QUALITY_SIZE == 64
    assert {k: sum(i.kind == k for i in items) for k in KINDS} == dict.fromkeys(KINDS, 16)
    assert quality_set() == items  # the same seed, the same questions
    assert quality_set(seed=1) != items
    assert len({i.prompt for i in items}) == len(items)
    for item in items:
        assert _solve(item) == item.gold, item


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("936", "936"),
        (" 936.\n", "936"),
        ("The answer is 936.", "936"),
        ("Answer: `kq7-zv3-mt9`", "kq7-zv3-mt9"),
        ("**7,15, 42 , 61,93**", "7, 15, 42, 61, 93"),
        ("<think>\nlet me add\n</think>\n\n2024-04-04", "2024-04-04"),
        ('"KQ7-ZV3-MT9"', "kq7-zv3-mt9"),
    ],
)
def test_normalisation_accepts_the_same_answer_dressed_differently(answer: str, gold: str) -> None:
    assert normalise(answer) == normalise(gold)


@pytest.mark.parametrize(
    ("answer", "gold"),
    [("935", "936"), ("936 apples", "936"), ("93, 61, 42, 15, 7", "7, 15, 42, 61, 93")],
)
def test_normalisation_keeps_a_wrong_answer_wrong(answer: str, gold: str) -> None:
    assert normalise(answer) != normalise(gold)


def test_grading_and_the_gate() -> None:
    items = quality_set(size=8)
    right = grade(items, [i.gold for i in items])
    assert right.correct == 8 and right.share == 1.0 and right.wrong == []
    half = grade(items, [i.gold if n % 2 else "nope" for n, i in enumerate(items)])
    assert half.correct == 4 and len(half.wrong) == 4
    none = grade(items, [None] * 8)
    assert none.correct == 0 and none.unanswered == 8
    ok = check_quality(right, right, 0.95)
    assert ok.passed and ok.value == 1.0
    bad = check_quality(half, right, 0.95)
    assert bad.passed is False and bad.value == 0.5
    assert "4/8 right, the baseline 8/8" in bad.detail and len(bad.findings) == 4
    assert check_quality(half, none, 0.95).passed  # nothing to fall short of
    with pytest.raises(ValueError, match="7 answers to 8 questions"):
        grade(items, [None] * 7)


def test_combine_needs_every_part_that_was_reached() -> None:
    agree = GateResult(passed=True, detail="accuracy 1.0000", value=1.0, threshold=0.98)
    unreached = GateResult(passed=None, detail="no reference outputs on this track")
    good = GateResult(passed=True, detail="quality set: 64/64", value=1.0, threshold=0.95)
    poor = GateResult(passed=False, detail="quality set: 3/64", value=0.05, threshold=0.95)
    assert combine(agree, good).passed is True
    both_bad = combine(agree, poor)
    assert both_bad.passed is False and both_bad.value == 0.05
    alone = combine(unreached, good)
    assert alone.passed is True
    assert alone.detail.startswith("agreement with the reference not reached (no reference")
    assert combine(unreached, GateResult(passed=None, detail="x")).passed is None


# --- a scripted OpenAI-compatible server ----------------------------------------------------


@pytest.fixture
async def scripted() -> AsyncIterator[Callable[[Callable[[QualityItem], str]], object]]:
    """Start a chat server that answers each quality question with ``answer(item)``."""
    servers: list[TestServer] = []
    by_prompt = {i.prompt: i for i in quality_set()}
    seen: list[dict[str, object]] = []

    async def start(answer: Callable[[QualityItem], str]) -> TestServer:
        async def chat(request: web.Request) -> web.Response:
            body = await request.json()
            seen.append(body)
            item = by_prompt[body["messages"][-1]["content"]]
            reply = {"choices": [{"message": {"role": "assistant", "content": answer(item)}}]}
            return web.json_response(reply)

        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        return server

    start.seen = seen  # type: ignore[attr-defined]
    yield start
    for s in servers:
        await s.close()


def _wrong(item: QualityItem) -> str:
    if item.kind in ("arithmetic",):
        return str(int(item.gold) + 1)
    return item.gold[::-1]


async def test_a_server_that_answers_rightly_and_one_that_answers_wrongly(
    scripted: Callable[..., object],
) -> None:
    items = quality_set()
    right_server: TestServer = await scripted(lambda i: f"The answer is {i.gold}.")  # type: ignore[misc]
    wrong_server: TestServer = await scripted(_wrong)  # type: ignore[misc]
    right = grade(items, await ask_quality_set(str(right_server.make_url("")), "m", items))
    wrong = grade(items, await ask_quality_set(str(wrong_server.make_url("")), "m", items))
    assert right.correct == 64 and right.by_kind == dict.fromkeys(KINDS, 16)
    assert wrong.correct == 0 and wrong.unanswered == 0
    gate = check_quality(wrong, right, 0.95)
    assert gate.passed is False and gate.value == 0.0
    assert gate.findings[0].startswith("quality set: q000 (arithmetic): gold ")
    sent = scripted.seen[0]  # type: ignore[attr-defined]
    assert sent["temperature"] == 0 and sent["model"] == "m" and sent["stream"] is False


async def test_an_unreachable_server_answers_nothing() -> None:
    items = quality_set(size=4)
    answers = await ask_quality_set("http://127.0.0.1:9", "m", items, timeout_s=5)
    assert answers == [None] * 4 and grade(items, answers).correct == 0


# --- in the accuracy gate of a real-track evaluation ----------------------------------------


def test_off_on_the_random_weight_model_and_said_so(tmp_path: Path) -> None:
    """servegym-tiny: the gate's detail in trial.json says the set is off, and why."""
    loaded = load_task_folder(DATA / "tiny-cpu")
    assert quality_off_reason(loaded.task) == (
        "quality set off: servegym-tiny has random weights and answers none of it"
    )
    engine = StandInEngine(tmp_path / "pid")
    track = track_for(loaded, server_logs=tmp_path / "servers", engine=engine, model=MODEL)
    ev = evaluate(loaded, ServingConfig(), 7, track=track)
    assert ev.outcome == "scored"
    assert ev.gates["accuracy"].detail.endswith(
        "; quality set off: servegym-tiny has random weights and answers none of it"
    )


def _task_with_quality(tmp_path: Path, baseline_replies: Path) -> Path:
    folder = tmp_path / "tiny-quality"
    folder.mkdir()
    text = (DATA / "tiny-cpu" / "task.toml").read_text()
    text = text.replace('id = "tiny-cpu"', 'id = "tiny-quality"')
    text = text.replace(
        "[baseline]\n", f'[baseline]\nextra_args = ["--replies", "{baseline_replies}"]\n'
    )
    text = text.replace("min_ratio = 0.98\n", "min_ratio = 0.98\nquality_set = true\n")
    (folder / "task.toml").write_text(text)
    (folder / "instruction.md").write_text((DATA / "tiny-cpu" / "instruction.md").read_text())
    return folder


@pytest.mark.parametrize("answers", ["right", "wrong"])
def test_the_gate_of_an_evaluation_asks_both_sides(tmp_path: Path, answers: str) -> None:
    """The mock server answers from a scripted file: the baseline rightly, the submission
    rightly or wrongly; the accuracy gate fails the wrong one."""
    items = quality_set()
    right, wrong = tmp_path / "right.json", tmp_path / "wrong.json"
    right.write_text(json.dumps({i.prompt: i.gold for i in items}))
    wrong.write_text(json.dumps({i.prompt: _wrong(i) for i in items}))
    loaded = load_task_folder(_task_with_quality(tmp_path, right))
    assert QualityCheck.for_task(loaded.task).off is None
    engine = StandInEngine(tmp_path / "pid")
    track = track_for(loaded, server_logs=tmp_path / "servers", engine=engine, model=MODEL)
    replies = right if answers == "right" else wrong
    ev = evaluate(loaded, ServingConfig(extra_args=["--replies", str(replies)]), 7, track=track)
    gate = ev.gates["accuracy"]
    if answers == "right":
        assert ev.outcome == "scored" and gate.passed is True
        assert "quality set: 64/64 right, the baseline 64/64 (1.0000 >= the minimum 0.9500)" in (
            gate.detail
        )
    else:
        assert ev.outcome == "accuracy_failed" and gate.passed is False
        assert "quality set: 0/64 right, the baseline 64/64" in gate.detail
        assert gate.value == 0.0 and gate.threshold == 0.95
    # the stand-in has no reference outputs: the agreement part is named as not reached
    assert gate.detail.startswith("agreement with the reference not reached")


def test_a_sim_task_cannot_turn_the_set_on(tmp_path: Path) -> None:
    from servegym.errors import UserError

    src = Path(__file__).parents[1] / "tasks" / "voice-stream-h100"
    folder = tmp_path / "sim-quality"
    folder.mkdir()
    text = (src / "task.toml").read_text().replace('id = "voice-stream-h100"', 'id = "sim-quality"')
    text = text.replace("[accuracy]\n", "[accuracy]\nquality_set = true\n")
    if "[accuracy]" not in text:
        text += "\n[accuracy]\nquality_set = true\n"
    (folder / "task.toml").write_text(text)
    for name in ("instruction.md", "oracle.toml"):
        (folder / name).write_text((src / name).read_text())
    with pytest.raises(UserError, match="quality_set is asked of real servers"):
        load_task_folder(folder)
