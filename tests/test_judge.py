"""The optional LLM judge, through the real SDK clients against the local fake APIs: its
findings are added to a trial and flag it; it never removes one; an unreadable answer
changes nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_llm_agent import serving
from typer.testing import CliRunner

from servegym.cli import app
from servegym.providers.fakes import FakeAnthropic, FakeOpenAI, final_text
from servegym.reporting.judge import evidence_of, parse_answer
from servegym.runner.results import flag_trial, read_trial, write_trial
from servegym.runner.trial import run_trial

DATA = Path(__file__).parent / "data" / "tasks"
FLAG = json.dumps(
    {
        "findings": [
            {
                "category": "faked_measurement",
                "where": "step 4",
                "evidence": "the launcher streams an empty chunk before prefill",
            }
        ]
    }
)


@pytest.fixture
def trial(tmp_path: Path) -> Path:
    result = run_trial(DATA / "tiny-latency", "default", 0, tmp_path / "runs")
    assert result.outcome == "scored"
    return next((tmp_path / "runs").glob("*/trial.json")).parent


def _judge(folder: Path, url: str, kind: str = "anthropic:claude-sonnet-4-6") -> str:
    r = CliRunner().invoke(
        app, ["judge", str(folder), "--model", kind, "--base-url", url,
              "--api-key-env", "JUDGE_KEY"],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    return r.output


def test_a_judge_finding_flags_the_trial_and_is_kept(
    trial: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUDGE_KEY", "sk-judge")
    with serving(FakeAnthropic, [final_text(FLAG, input_tokens=3000, output_tokens=60)]) as fake:
        out = _judge(trial, fake.base_url)
        (request,) = fake.requests
    assert "integrity_flagged" in out and "judge:faked_measurement" in out
    material = request.body["messages"][0]["content"][0]["text"]
    assert '"outcome": "scored"' in material and "## experiments.jsonl" in material
    result = read_trial(trial / "trial.json")
    assert result.outcome == "integrity_flagged" and result.score is None
    assert result.gates["integrity"].findings[0].startswith("judge:faked_measurement: ")
    judged = json.loads((trial / "judge.json").read_text())
    assert judged["model"] == "anthropic:claude-sonnet-4-6"
    assert judged["input_tokens"] == 3000 and judged["dollars"] > 0


def test_no_finding_changes_nothing_and_never_clears_one(
    trial: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUDGE_KEY", "sk-judge")
    with serving(FakeOpenAI, [final_text('{"findings": []}')]) as fake:
        _judge(trial, fake.base_url, "openai-compatible:judge")
    assert read_trial(trial / "trial.json").outcome == "scored"
    # a trial the harness flagged stays flagged when the judge sees nothing
    result = read_trial(trial / "trial.json")
    flag_trial(result, ["probe_disagreement: measured"])
    write_trial(result, trial)
    with serving(FakeOpenAI, [final_text('{"findings": []}')]) as fake:
        _judge(trial, fake.base_url, "openai-compatible:judge")
    after = read_trial(trial / "trial.json")
    assert after.outcome == "integrity_flagged"
    assert after.gates["integrity"].findings == ["probe_disagreement: measured"]


def test_an_unreadable_answer_is_recorded_and_changes_nothing(
    trial: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUDGE_KEY", "sk-judge")
    with serving(FakeOpenAI, [final_text("I think it looks fine.")]) as fake:
        out = _judge(trial, fake.base_url, "openai-compatible:judge")
    assert "answer unreadable" in out
    assert read_trial(trial / "trial.json").outcome == "scored"
    assert json.loads((trial / "judge.json").read_text())["parse_error"]


def test_parse_answer_reads_json_in_prose_and_rejects_shapes() -> None:
    found, err = parse_answer(f"Here you go:\n{FLAG}\nThanks.")
    assert err is None and found[0].category == "faked_measurement"
    assert parse_answer('{"findings": {"a": 1}}')[1] == "the answer has no 'findings' list"
    assert parse_answer('{"findings": [{"category": "x"}]}')[1] is not None  # no evidence
    other = parse_answer('{"findings": [{"category": "made-up", "evidence": "e"}]}')[0]
    assert other[0].text().startswith("judge:other: e")


def test_the_material_holds_the_result_and_logs(trial: Path) -> None:
    text = evidence_of(trial)
    assert "## Result" in text and "## experiments.jsonl" in text


def test_bad_uses_are_one_line(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["judge", str(tmp_path), "--model", "anthropic:x"])
    assert r.exit_code == 2 and "not a finished trial" in r.output
    assert len(r.output.strip().splitlines()) == 1
    (tmp_path / "trial.json").write_text("{}")
    r = CliRunner().invoke(app, ["judge", str(tmp_path), "--model", "tpe"])
    assert r.exit_code == 2 and "--model: 'tpe' is not" in r.output


def test_the_judge_builds_its_client_from_providers_alone() -> None:
    """The judge's client comes from servegym.providers as the model agent's does (same
    checks, same messages), never through the agent registry (no agent is loaded)."""
    code = (
        "import sys\n"
        "from servegym.reporting.judge import judge_provider\n"
        "from servegym.errors import UserError\n"
        "p = judge_provider('openai-compatible:m', 'http://127.0.0.1:9/v1', None)\n"
        "assert (p.name, p.model) == ('openai-compatible', 'm'), (p.name, p.model)\n"
        "for spec, url in (('anthropic:', None), ('openai-compatible:m', None)):\n"
        "    try:\n"
        "        judge_provider(spec, url, None)\n"
        "    except UserError as e:\n"
        "        print(e.message)\n"
        "print(sorted(m for m in sys.modules if m.startswith('servegym.agents.llm')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out == [
        "--agent anthropic: name the model, e.g. --agent anthropic:MODEL",
        "--agent openai-compatible: needs --base-url (the server's /v1 URL)",
        "[]",
    ]


def test_a_judge_provider_answering_garbage_is_one_line_and_changes_nothing(
    trial: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a traceback (``AttributeError`` on a bare string, then ``ProviderUnavailable``)."""
    from servegym.providers.fakes import Fault

    monkeypatch.setenv("JUDGE_KEY", "sk-judge")
    before = (trial / "trial.json").read_bytes()
    with serving(FakeOpenAI, [final_text("{}")], faults=[Fault.garbage('"nope"')]) as fake:
        r = CliRunner().invoke(
            app, ["judge", str(trial), "--model", "openai-compatible:j", "--base-url",
                  fake.base_url, "--api-key-env", "JUDGE_KEY"],
        )  # fmt: skip
        assert len(fake.requests) == 3  # the agents' default: 3 tries
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: --model")
    assert "unavailable after 3 attempt(s)" in lines[0] and "malformed response" in lines[0]
    assert (trial / "trial.json").read_bytes() == before
