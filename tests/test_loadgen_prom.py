"""Prometheus scraping: which samples are kept, deltas, a missing endpoint."""

from __future__ import annotations

from typing import TYPE_CHECKING

import aiohttp
import pytest

from servegym.loadgen.prom import delta, parse_cumulative, scrape

if TYPE_CHECKING:
    from tests.conftest import MockFactory

TEXT = """\
# HELP vllm:prompt_tokens_total Prefill tokens.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{model_name="m"} 100.0
vllm:prompt_tokens_created{model_name="m"} 1.7e9
# TYPE plain_counter counter
plain_counter 3
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 4
# TYPE vllm:ttft_seconds histogram
vllm:ttft_seconds_bucket{le="0.1",model_name="m"} 2
vllm:ttft_seconds_bucket{le="+Inf",model_name="m"} 3
vllm:ttft_seconds_count{model_name="m"} 3
vllm:ttft_seconds_sum{model_name="m"} 0.25
# TYPE rpc_seconds summary
rpc_seconds{quantile="0.5"} 0.1
rpc_seconds_count 7
rpc_seconds_sum 1.5
"""


def test_only_cumulative_samples_are_kept() -> None:
    samples = parse_cumulative(TEXT)
    assert samples == {
        'vllm:prompt_tokens_total{model_name="m"}': 100.0,
        "plain_counter_total": 3.0,
        'vllm:ttft_seconds_count{model_name="m"}': 3.0,
        'vllm:ttft_seconds_sum{model_name="m"}': 0.25,
        "rpc_seconds_count": 7.0,
        "rpc_seconds_sum": 1.5,
    }


def test_labels_are_sorted_in_keys() -> None:
    text = '# TYPE c_total counter\nc_total{b="2",a="1"} 1\n'
    assert parse_cumulative(text) == {'c_total{a="1",b="2"}': 1.0}


def test_delta() -> None:
    before = {"a": 1.0, "b": 5.0}
    after = {"a": 4.0, "b": 5.0, "c": 2.0}
    assert delta(before, after) == {"a": 3.0, "b": 0.0, "c": 2.0}
    assert delta(None, after) == {} and delta(before, None) == {}


def test_bad_text_raises_value_error() -> None:
    with pytest.raises(ValueError):
        parse_cumulative("# TYPE x counter\nx_total{ 1\n")


async def test_scrape_present_and_missing(mock_factory: MockFactory) -> None:
    server = await mock_factory(ttft_ms=0, itl_ms=0)
    async with aiohttp.ClientSession() as http:
        got = await scrape(http, server.url)
        assert got is not None and 'vllm:generation_tokens_total{model_name="mock"}' in got
        assert await scrape(http, server.url + "/nothing-here") is None
        assert await scrape(http, "http://127.0.0.1:1") is None
