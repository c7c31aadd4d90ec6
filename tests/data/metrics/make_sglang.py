"""Writes ``sglang-before.txt`` and ``sglang-after.txt``: SGLang ``/metrics`` text before and
after a run of 40 requests, as SGLang's server writes it. There is no GPU to record a real
server on, so the text is made the way SGLang makes it: by ``prometheus_client``, from the
metric definitions of SGLang 0.5's ``python/sglang/srt/metrics/collector.py`` (names, types,
label names, buckets) for the metrics ServeGym reads and a few it does not.
``sglang-busy.txt`` is a scrape during a run (the gauges' peaks).

    python tests/data/metrics/make_sglang.py
"""

from __future__ import annotations

from pathlib import Path

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

HERE = Path(__file__).parent
SCHEDULER = {
    "model_name": "Qwen/Qwen3-8B",
    "engine_type": "unified",
    "tp_rank": "0",
    "pp_rank": "0",
    "moe_ep_rank": "0",
}
TOKENIZER = {"model_name": "Qwen/Qwen3-8B"}
TTFT_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
QUEUE_BUCKETS = [0.0, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60]


def exposition(
    requests: int,
    prompt: int,
    generated: int,
    cached: int,
    retracted: int,
    ttfts: list[float],
    queues: list[float],
    gauges: dict[str, float],
) -> str:
    reg = CollectorRegistry()

    def counter(name: str, labels: dict[str, str], value: float) -> None:
        c = Counter(name, name, labelnames=list(labels), registry=reg)
        c.labels(**labels).inc(value)

    counter("sglang:prompt_tokens_total", TOKENIZER, prompt)
    counter("sglang:generation_tokens_total", TOKENIZER, generated)
    counter("sglang:cached_tokens_total", TOKENIZER, cached)
    counter("sglang:num_requests_total", TOKENIZER, requests)
    counter("sglang:num_aborted_requests_total", TOKENIZER, 0)
    counter("sglang:num_retracted_requests_total", SCHEDULER, retracted)
    ttft = Histogram(
        "sglang:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        labelnames=list(TOKENIZER),
        buckets=TTFT_BUCKETS,
        registry=reg,
    )
    for v in ttfts:
        ttft.labels(**TOKENIZER).observe(v)
    queue = Histogram(
        "sglang:queue_time_seconds",
        "Histogram of queueing time in seconds.",
        labelnames=list(SCHEDULER),
        buckets=QUEUE_BUCKETS,
        registry=reg,
    )
    for v in queues:
        queue.labels(**SCHEDULER).observe(v)
    for name, value in gauges.items():
        g = Gauge(name, name, labelnames=list(SCHEDULER), registry=reg)
        g.labels(**SCHEDULER).set(value)
    return generate_latest(reg).decode()


IDLE = {
    "sglang:num_running_reqs": 0,
    "sglang:num_used_tokens": 0,
    "sglang:token_usage": 0.0,
    "sglang:num_queue_reqs": 0,
    "sglang:gen_throughput": 0.0,
    "sglang:cache_hit_rate": 0.0,
    "sglang:max_total_num_tokens": 650000,
}
BUSY = {
    **IDLE,
    "sglang:num_running_reqs": 24,
    "sglang:num_used_tokens": 61000,
    "sglang:token_usage": 0.61,
    "sglang:num_queue_reqs": 5,
    "sglang:gen_throughput": 2890.5,
}

if __name__ == "__main__":
    # SGLang's server runs prometheus_client in multiprocess mode, which writes no
    # ``_created`` samples
    disable_created_metrics()
    # 4 warm-up requests before; then 40 more: 40,000 prompt tokens (10,000 from the radix
    # cache), 6,400 generated, 3 retracted; TTFT 0.1 s each; queued 0.02 s each
    before = exposition(4, 4000, 640, 0, 0, [0.25] * 4, [0.0] * 4, IDLE)
    after = exposition(
        44, 44000, 7040, 10000, 3, [0.25] * 4 + [0.1] * 40, [0.0] * 4 + [0.02] * 40, IDLE
    )
    busy = exposition(24, 24000, 3000, 6000, 1, [0.25] * 24, [0.0] * 24, BUSY)
    (HERE / "sglang-before.txt").write_text(before)
    (HERE / "sglang-after.txt").write_text(after)
    (HERE / "sglang-busy.txt").write_text(busy)
