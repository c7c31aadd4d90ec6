"""A server's own figures of a run (:mod:`servegym.scoring.server_figures`) and the gauges
sampled from ``/metrics`` during it (:func:`~servegym.loadgen.prom.parse_gauges`,
:class:`~servegym.loadgen.prom.GaugeSampler`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from servegym.loadgen.prom import GaugeSampler, parse_gauges
from servegym.scoring.server_figures import ServerFigures, server_figures

L0 = '{engine="0",model_name="m"}'
L1 = '{engine="1",model_name="m"}'

VLLM_DELTA = {
    'vllm:request_success_total{engine="0",finished_reason="length",model_name="m"}': 30.0,
    'vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"}': 2.0,
    'vllm:request_success_total{engine="1",finished_reason="length",model_name="m"}': 8.0,
    f"vllm:prompt_tokens_total{L0}": 3000.0,
    f"vllm:prompt_tokens_total{L1}": 1000.0,
    f"vllm:generation_tokens_total{L0}": 640.0,
    f"vllm:prefix_cache_queries_total{L0}": 3000.0,
    f"vllm:prefix_cache_queries_total{L1}": 1000.0,
    f"vllm:prefix_cache_hits_total{L0}": 900.0,
    f"vllm:prefix_cache_hits_total{L1}": 100.0,
    f"vllm:num_preemptions_total{L0}": 3.0,
    f"vllm:request_queue_time_seconds_sum{L0}": 0.5,
    f"vllm:request_queue_time_seconds_count{L0}": 30.0,
    f"vllm:request_queue_time_seconds_sum{L1}": 0.3,
    f"vllm:request_queue_time_seconds_count{L1}": 10.0,
    f"vllm:time_to_first_token_seconds_sum{L0}": 3.0,
    f"vllm:time_to_first_token_seconds_count{L0}": 30.0,
    f"vllm:time_to_first_token_seconds_sum{L1}": 1.0,
    f"vllm:time_to_first_token_seconds_count{L1}": 10.0,
    # a longer name sharing the prefix must not be summed in
    f"vllm:prompt_tokens_total_cached{L0}": 99999.0,
}
GAUGES = {
    f"vllm:kv_cache_usage_perc{L0}": 0.42,
    f"vllm:kv_cache_usage_perc{L1}": 0.61,
    f"vllm:num_requests_running{L0}": 12.0,
    f"vllm:num_requests_waiting{L0}": 5.0,
}


def test_figures_from_a_vllm_delta() -> None:
    f = server_figures(VLLM_DELTA, GAUGES, client_ttft_mean_ms=120.0, client_count=40)
    assert f is not None and f.engine == "vllm"
    assert f.requests == 40.0
    assert f.prompt_tokens == 4000.0 and f.generation_tokens == 640.0
    assert f.prefix_cache_queries == 4000.0 and f.prefix_cache_hits == 1000.0
    assert f.prefix_cache_hit_rate == pytest.approx(0.25)
    assert f.preemptions == 3.0
    assert f.queue_time_mean_ms == pytest.approx(800.0 / 40)  # (0.5 + 0.3) s / 40
    assert f.ttft_mean_ms == pytest.approx(100.0)  # 4 s / 40
    assert f.kv_cache_usage_peak == pytest.approx(0.61)
    assert f.running_peak == 12.0 and f.waiting_peak == 5.0
    check = f.ttft_check
    assert check is not None and check.consistent and check.note == ""
    assert check.server_count == 40 and check.client_count == 40
    assert check.server_mean_ms == pytest.approx(100.0)


def test_missing_figures_are_none() -> None:
    delta = {f"vllm:prompt_tokens_total{L0}": 10.0}
    f = server_figures(delta, {}, client_ttft_mean_ms=50.0, client_count=3)
    assert f is not None
    assert f.prompt_tokens == 10.0
    assert f.requests is None and f.prefix_cache_hit_rate is None
    assert f.queue_time_mean_ms is None and f.ttft_mean_ms is None
    assert f.kv_cache_usage_peak is None and f.ttft_check is None


def test_zero_queries_give_no_hit_rate() -> None:
    delta = {"vllm:prefix_cache_queries_total": 0.0, "vllm:prefix_cache_hits_total": 0.0}
    f = server_figures(delta, {}, None, 0)
    assert f is not None and f.prefix_cache_hit_rate is None


def test_no_engine_metrics_give_none() -> None:
    assert server_figures({}, {}, 10.0, 1) is None
    other = {"http_requests_total": 5.0, "process_cpu_seconds_total": 1.0}
    assert server_figures(other, GAUGES, 10.0, 1) is None


def test_sglang_prefix() -> None:
    delta = {
        "sglang:prompt_tokens_total": 100.0,
        "sglang:time_to_first_token_seconds_sum": 2.0,
        "sglang:time_to_first_token_seconds_count": 10.0,
    }
    gauges = {"sglang:num_running_reqs": 7.0}  # SGLang's name (its engine declares it)
    f = server_figures(delta, gauges, 230.0, 10)
    assert f is not None and f.engine == "sglang"
    assert f.prompt_tokens == 100.0 and f.ttft_mean_ms == pytest.approx(200.0)
    assert f.running_peak == 7.0
    assert f.ttft_check is not None and f.ttft_check.consistent


def _renamed(values: dict[str, float], names: dict[str, str]) -> dict[str, float]:
    """``values`` with each sample's metric name replaced by ``names[name]``."""
    out: dict[str, float] = {}
    for key, value in values.items():
        name, brace, labels = key.partition("{")
        if name in names:
            out[names[name] + brace + labels] = value
    return out


def test_sglang_names_map_to_the_same_figures() -> None:
    """The names SGLang's engine declares give the figures vLLM's give for the same run."""
    from servegym.engines.base import get_engine

    vllm, sglang = get_engine("vllm").metrics, get_engine("sglang").metrics
    assert vllm is not None and sglang is not None
    assert get_engine("vllm-cpu").metrics == vllm
    fields = [
        "requests",
        "generation_tokens",
        "prefix_cache_hits",
        "preemptions",
        "kv_cache_usage",
        "running",
        "waiting",
    ]
    to_sglang = {getattr(vllm, f): getattr(sglang, f) for f in fields}
    for hist in ("queue_time", "ttft"):
        for part in ("_sum", "_count"):
            to_sglang[getattr(vllm, hist) + part] = getattr(sglang, hist) + part
    # SGLang counts no prefix-cache lookups: its prompt tokens are the queries
    to_sglang["vllm:prompt_tokens_total"] = "sglang:prompt_tokens_total"
    delta = {k: v for k, v in VLLM_DELTA.items() if "prefix_cache_queries" not in k}
    expected = server_figures(VLLM_DELTA, GAUGES, client_ttft_mean_ms=120.0, client_count=40)
    f = server_figures(
        _renamed(delta, to_sglang), _renamed(GAUGES, to_sglang), 120.0, client_count=40
    )
    assert f is not None and expected is not None and f.engine == "sglang"
    assert f.model_dump(exclude={"engine"}) == expected.model_dump(exclude={"engine"})
    assert set(sglang.gauges()) == {
        "sglang:token_usage",
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
    }


@pytest.mark.parametrize(
    ("client_ms", "consistent"),
    [
        (100.0, True),
        (500.0, True),  # the client's TTFT includes the HTTP path
        (86.0, True),  # within 10% + 5 ms of the server's 100 ms
        (84.0, False),
        (2.0, False),  # a whitespace chunk streamed ahead of the first token
    ],
)
def test_ttft_check(client_ms: float, consistent: bool) -> None:
    f = server_figures(VLLM_DELTA, {}, client_ttft_mean_ms=client_ms, client_count=40)
    assert f is not None and f.ttft_check is not None
    check = f.ttft_check
    assert check.consistent is consistent
    assert check.client_mean_ms == client_ms
    if consistent:
        assert check.note == ""
    else:
        assert "sooner" in check.note and f"{100.0 - client_ms:.1f} ms" in check.note


def test_ttft_check_notes_a_count_mismatch() -> None:
    f = server_figures(VLLM_DELTA, {}, client_ttft_mean_ms=120.0, client_count=37)
    assert f is not None and f.ttft_check is not None
    assert f.ttft_check.consistent
    assert f.ttft_check.note == "server counted 40 first tokens, clients 37"
    faked = server_figures(VLLM_DELTA, {}, client_ttft_mean_ms=1.0, client_count=37)
    assert faked is not None and faked.ttft_check is not None
    assert not faked.ttft_check.consistent
    assert "sooner" in faked.ttft_check.note and "clients 37" in faked.ttft_check.note


def test_no_ttft_check_without_a_client_mean() -> None:
    f = server_figures(VLLM_DELTA, {}, client_ttft_mean_ms=None, client_count=0)
    assert f is not None and f.ttft_check is None and f.ttft_mean_ms is not None


# --- parse_gauges ---------------------------------------------------------------------------

TEXT = """\
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m",engine="0"} 0.25
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 3
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16"} 1
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{model_name="m"} 100
# TYPE vllm:ttft_seconds histogram
vllm:ttft_seconds_bucket{le="+Inf",model_name="m"} 3
vllm:ttft_seconds_count{model_name="m"} 3
vllm:ttft_seconds_sum{model_name="m"} 0.25
"""


def test_parse_gauges() -> None:
    everything = parse_gauges(TEXT)
    assert everything == {
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"}': 0.25,
        'vllm:num_requests_running{model_name="m"}': 3.0,
        'vllm:num_requests_waiting{model_name="m"}': 0.0,
        'vllm:cache_config_info{block_size="16"}': 1.0,
    }
    some = parse_gauges(TEXT, ("kv_cache_usage", "num_requests_waiting"))
    assert set(some) == {
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"}',
        'vllm:num_requests_waiting{model_name="m"}',
    }
    assert parse_gauges("") == {}


# --- GaugeSampler ---------------------------------------------------------------------------

KV_VALUES = [0.1, 0.5, 0.9, 0.3, 0.2]


def metrics_text(kv: float, running: int) -> str:
    return (
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        f'vllm:kv_cache_usage_perc{{model_name="m"}} {kv}\n'
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{model_name="m"}} {running}\n'
        "# TYPE vllm:prompt_tokens_total counter\n"
        'vllm:prompt_tokens_total{model_name="m"} 1000\n'
    )


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[web.Application], object]]:
    servers: list[TestServer] = []

    async def start(app: web.Application) -> TestServer:
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        return server

    yield start
    for s in servers:
        await s.close()


async def test_gauge_sampler_keeps_each_peak(serve: Callable[..., object]) -> None:
    hits: list[int] = []

    async def metrics(request: web.Request) -> web.Response:
        i = len(hits)
        hits.append(i)
        kv = KV_VALUES[min(i, len(KV_VALUES) - 1)]
        return web.Response(text=metrics_text(kv, running=i % 3))

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    server: TestServer = await serve(app)  # type: ignore[misc]
    async with aiohttp.ClientSession() as http:
        sampler = GaugeSampler(http, str(server.make_url("/")), interval_s=0.02)
        sampler.start()
        for _ in range(500):
            if len(hits) > len(KV_VALUES):
                break
            await asyncio.sleep(0.01)
        peaks = await sampler.stop()
    assert len(hits) > len(KV_VALUES)
    assert peaks == {
        'vllm:kv_cache_usage_perc{model_name="m"}': 0.9,
        'vllm:num_requests_running{model_name="m"}': 2.0,
    }
    stopped_at = len(hits)
    await asyncio.sleep(0.1)
    assert len(hits) == stopped_at  # stop() really stops it


async def test_gauge_sampler_stops_asking_without_metrics(serve: Callable[..., object]) -> None:
    hits: list[str] = []

    async def not_found(request: web.Request) -> web.Response:
        hits.append(request.path)
        raise web.HTTPNotFound()

    app = web.Application()
    app.router.add_get("/metrics", not_found)
    server: TestServer = await serve(app)  # type: ignore[misc]
    async with aiohttp.ClientSession() as http:
        sampler = GaugeSampler(http, str(server.make_url("/")), interval_s=0.02)
        sampler.start()
        await asyncio.sleep(0.3)
        peaks = await sampler.stop()
    assert hits == ["/metrics"]
    assert peaks == {}


async def test_gauge_sampler_without_a_server() -> None:
    async with aiohttp.ClientSession() as http:
        sampler = GaugeSampler(http, "http://127.0.0.1:9", interval_s=0.02)
        sampler.start()
        await asyncio.sleep(0.1)
        assert await sampler.stop() == {}
        assert await sampler.stop() == {}  # twice is fine


# --- recorded /metrics text of each engine, through the harness's own scrape path -----------

METRICS = Path(__file__).parent / "data" / "metrics"


async def _figures_of(
    serve: Callable[..., object], engine: str, texts: tuple[str, str, str], client_ms: float
) -> ServerFigures | None:
    """Serve ``before``, ``busy`` and ``after`` in turn as ``/metrics`` and read them as a
    run does: a scrape, the gauge sampler during the run, a scrape, the delta's figures."""
    from servegym.engines.base import get_engine
    from servegym.loadgen import prom

    current = {"text": texts[0]}

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=current["text"], content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    server: TestServer = await serve(app)  # type: ignore[misc]
    url = str(server.make_url("/"))
    declared = get_engine(engine).metrics
    assert declared is not None
    async with aiohttp.ClientSession() as http:
        before = await prom.scrape(http, url)
        current["text"] = texts[1]
        sampler = GaugeSampler(http, url, gauges=declared.gauges(), interval_s=0.02)
        sampler.start()
        await asyncio.sleep(0.1)
        peaks = await sampler.stop()
        current["text"] = texts[2]
        after = await prom.scrape(http, url)
    assert before is not None and after is not None
    delta = prom.delta(before, after)
    return server_figures(delta, peaks, client_ms, int(delta.get(_TTFT_COUNT[engine], 0)))


_TTFT_COUNT = {
    "sglang": 'sglang:time_to_first_token_seconds_count{model_name="Qwen/Qwen3-8B"}',
    "vllm-cpu": 'vllm:time_to_first_token_seconds_count{engine="0",model_name="servegym-tiny"}',
}


def _texts(stem: str) -> tuple[str, str, str]:
    before, busy, after = (METRICS / f"{stem}-{p}.txt" for p in ("before", "busy", "after"))
    return before.read_text(), busy.read_text(), after.read_text()


async def test_sglang_metrics_text_gives_its_figures(serve: Callable[..., object]) -> None:
    """SGLang's own names (``sglang:num_running_reqs``, ``sglang:token_usage``, ...), in the
    text its server writes (``tests/data/metrics/make_sglang.py``)."""
    f = await _figures_of(serve, "sglang", _texts("sglang"), 105.0)
    assert f is not None and f.engine == "sglang"
    assert f.requests == 40 and f.prompt_tokens == 40000 and f.generation_tokens == 6400
    assert f.prefix_cache_queries == 40000 and f.prefix_cache_hits == 10000
    assert f.prefix_cache_hit_rate == pytest.approx(0.25)
    assert f.preemptions == 3
    assert f.queue_time_mean_ms == pytest.approx(20.0)
    assert f.ttft_mean_ms == pytest.approx(100.0)
    assert f.kv_cache_usage_peak == pytest.approx(0.61)
    assert f.running_peak == 24 and f.waiting_peak == 5
    assert f.ttft_check is not None and f.ttft_check.consistent
    assert f.ttft_check.server_count == 40 and f.ttft_check.note == ""


async def test_vllm_metrics_text_gives_its_figures(serve: Callable[..., object]) -> None:
    """vLLM's names, in text recorded from vllm-cpu 0.32.0 serving servegym-tiny (the same
    names as the CUDA build's): 16 requests of 120 prompt tokens and 48 output tokens,
    scraped before, at their peak and after."""
    f = await _figures_of(serve, "vllm-cpu", _texts("vllm-cpu"), 1300.0)
    assert f is not None and f.engine == "vllm"
    assert f.requests == 16 and f.prompt_tokens == 16 * 120 and f.generation_tokens == 16 * 48
    assert f.prefix_cache_queries == 16 * 120 and f.prefix_cache_hits == 0
    assert f.preemptions == 0
    assert f.queue_time_mean_ms is not None and 0 < f.queue_time_mean_ms < 1
    assert f.ttft_mean_ms == pytest.approx(1218.235, abs=0.01)
    assert f.running_peak == 16 and f.waiting_peak == 0
    assert f.kv_cache_usage_peak == pytest.approx(0.0078163, abs=1e-6)
    assert f.ttft_check is not None and f.ttft_check.consistent and f.ttft_check.note == ""


def test_each_engine_reads_only_its_own_names() -> None:
    """vLLM's text read by SGLang's declared names gives nothing, and the other way round:
    the figures come from the names an engine declares, not from names that look alike."""
    from servegym.engines.base import get_engine
    from servegym.loadgen import prom

    vllm, sglang = get_engine("vllm").metrics, get_engine("sglang").metrics
    texts = {"vllm-cpu": _texts("vllm-cpu"), "sglang": _texts("sglang")}
    deltas = {
        k: prom.delta(prom.parse_cumulative(t[0]), prom.parse_cumulative(t[2]))
        for k, t in texts.items()
    }
    assert server_figures(deltas["vllm-cpu"], {}, None, 0, names=sglang) is None
    assert server_figures(deltas["sglang"], {}, None, 0, names=vllm) is None
    # every name each engine declares is in its own text, with the type it reads it as
    for stem, m in (("vllm-cpu", vllm), ("sglang", sglang)):
        assert m is not None
        text = texts[stem][2]
        for name in (m.requests, m.prompt_tokens, m.generation_tokens, m.preemptions):
            assert name is not None and f"# TYPE {name} counter" in text
        for name in (m.queue_time, m.ttft):
            assert f"# TYPE {name} histogram" in text
        for name in m.gauges():
            assert f"# TYPE {name} gauge" in text
