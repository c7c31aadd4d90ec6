"""SLA and Price: the ``--sla`` flag form and validation."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from servegym.errors import UserError
from servegym.scoring.sla import SLA, Price


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ttft_ms=200,tpot_ms=50", SLA(ttft_ms=200, tpot_ms=50)),
        ("e2e_ms=1500", SLA(e2e_ms=1500)),
        (" ttft_ms = 0.5 , e2e_ms=2e3 ", SLA(ttft_ms=0.5, e2e_ms=2000)),
        ("tpot_ms=50,ttft_ms=200,e2e_ms=9000", SLA(ttft_ms=200, tpot_ms=50, e2e_ms=9000)),
    ],
)
def test_parse_good(text: str, expected: SLA) -> None:
    assert SLA.parse(text) == expected
    assert SLA.parse(expected.to_flag()) == expected


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("", "no objectives"),
        ("  ", "no objectives"),
        ("ttft_ms", "'ttft_ms'"),
        ("ttft_ms:200", "'ttft_ms:200'"),
        ("ttft=200", "'ttft=200'"),
        ("ttft_ms=200,foo_ms=1", "'foo_ms=1'"),
        ("ttft_ms=fast", "'ttft_ms=fast'"),
        ("ttft_ms=", "'ttft_ms='"),
        ("ttft_ms=0", "'ttft_ms=0'"),
        ("tpot_ms=-5", "'tpot_ms=-5'"),
        ("e2e_ms=nan", "'e2e_ms=nan'"),
        ("e2e_ms=inf", "'e2e_ms=inf'"),
        ("ttft_ms=1,ttft_ms=2", "more than once"),
        ("ttft_ms=1,", "empty part"),
    ],
)
def test_parse_bad(text: str, names: str) -> None:
    with pytest.raises(UserError) as info:
        SLA.parse(text)
    message = str(info.value)
    assert message.startswith("--sla: ")
    assert names in message
    assert "\n" not in message


def test_sla_validation() -> None:
    assert SLA().is_empty and not SLA(ttft_ms=1).is_empty
    for bad in ({"ttft_ms": 0}, {"tpot_ms": -1}, {"e2e_ms": float("inf")}, {"p99_ms": 1}):
        with pytest.raises(ValidationError):
            SLA(**bad)


def test_price_validation() -> None:
    assert Price(price_per_hour=0).gpus == 1
    for bad in ({"price_per_hour": -1}, {"price_per_hour": 1, "gpus": 0}, {"gpus": 1}):
        with pytest.raises(ValidationError):
            Price(**bad)
