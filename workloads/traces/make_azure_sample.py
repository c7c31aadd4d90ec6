"""Write ``azure-sample.csv``: a small SYNTHETIC trace in the Azure LLM inference layout.

Not recorded data. The arrivals are a two-state (quiet / burst) Markov-modulated Poisson
process, so the trace is bursty the way the real traces are; context and generated token
counts are lognormal. Deterministic: running this again writes the same bytes.

    python workloads/traces/make_azure_sample.py
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import numpy as np

ROWS = 200
SEED = 2023_11_16
START = datetime(2023, 11, 16, 18, 15, 46)
QUIET_RATE, QUIET_MEAN_S = 0.6, 25.0  # requests/s, mean length of a quiet spell
BURST_RATE, BURST_MEAN_S = 6.0, 6.0  # requests/s, mean length of a burst


def arrival_times(rng: np.random.Generator, n: int) -> list[float]:
    times: list[float] = []
    t, burst = 0.0, False
    while len(times) < n:
        rate, mean = (BURST_RATE, BURST_MEAN_S) if burst else (QUIET_RATE, QUIET_MEAN_S)
        end = t + rng.exponential(mean)
        while len(times) < n:
            t += rng.exponential(1.0 / rate)
            if t > end:
                t = end
                break
            times.append(t)
        burst = not burst
    return times


def main() -> None:
    rng = np.random.default_rng(SEED)
    times = arrival_times(rng, ROWS)
    context = np.clip(np.rint(1020 * np.exp(1.0 * rng.standard_normal(ROWS))), 3, 16000)
    generated = np.clip(np.rint(180 * np.exp(0.9 * rng.standard_normal(ROWS))), 1, 2000)
    offset = 0.6805900  # the first row's fraction, as in the Azure 2023 traces
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for t, c, g in zip(times, context, generated, strict=True):
        ticks = round((t + offset) * 10_000_000)  # 100 ns ticks: 7 fraction digits
        whole, frac = divmod(ticks, 10_000_000)
        stamp = (START + timedelta(seconds=whole)).strftime("%Y-%m-%d %H:%M:%S")
        lines.append(f"{stamp}.{frac:07d},{int(c)},{int(g)}")
    out = Path(__file__).with_name("azure-sample.csv")
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {out} ({ROWS} rows, {times[-1] - times[0]:.1f} s)")


if __name__ == "__main__":
    main()
