"""Load-generator capacity: the highest constant request rate each generator keeps to schedule.

For ServeGym's load generator and, when installed, ``vllm bench serve`` and ``guidellm``, find
the highest request rate ``R`` each sustains against ServeGym's mock server with a p99 send
lag of at most ``--max-lag-ms`` (1 ms), and print them side by side with ratios, from one run.
The same search at a looser limit (``--also-lag-ms``, 5 ms) is reported beside it, so that a
tool whose timer cannot reach 1 ms at any rate still gets a capacity figure.

Method (the same for every tool; ``benchmarks/README.md`` has the reasoning):

- One mock server process (``python -m servegym.loadgen.mock_server``) serves every trial of
  every tool: short requests (8 prompt tokens, 4 output tokens in one chunk, TTFT and ITL 0),
  so the server costs as little as possible per request.
- Each tool runs in its own Python environment, in one long-lived worker process that serves
  all its trials (``_worker_<tool>.py``), at a constant rate: ServeGym's ``constant``
  arrival, ``vllm bench serve --request-rate R --burstiness inf``, guidellm's ``constant``
  profile. A trial is ``N = R x --trial-seconds`` requests (within bounds).
- Send lag is measured on the server, the same way for every tool: the server stamps each
  request's receipt with ``perf_counter_ns``; sorted receipts ``a_i`` give
  ``lag_i = (a_i - i/R) - min_j (a_j - j/R)`` (the schedule anchored on the request that got
  through fastest, so no lag is negative and a late first request hides nothing); the first
  ``max(10, 10%)`` requests are warm-up and left out; the figure is the p99 of the rest.
  ServeGym's own p99 send lag (sent - scheduled, taken in the client) is shown beside it.
- A trial passes when that p99 is within the limit, every request reached the server and
  completed there, and the tool reported no failure. A small shared machine stalls now and
  then, so a rate gets up to ``--attempts`` trials (3) and passes when ``--passes`` of them
  (2) pass; a failure no retry would fix (lost requests, a tool that cannot keep up, a
  median lag over the limit) fails the rate at once.
- The search climbs a ladder from ``--start-rate`` by ``--growth`` until a rate fails (after
  ``--patience`` failing rungs, or at once when the tool cannot keep up at all), then bisects
  geometrically between the highest passing and the lowest failing rate until they are
  within ``--tolerance``. Trials are shared between the two limits (one trial is judged
  against both). The tools take turns, one trial each, so that slow drifts in the machine's
  noise fall on all of them alike.

Run from the repository root::

    .venv/bin/python benchmarks/loadgen_capacity.py [--quick] \\
        [--vllm-python PATH] [--guidellm PATH] [--json OUT]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _tokenizer import build_tokenizer  # noqa: E402

MODEL = "mock"
TOOLS = ("servegym", "vllm", "guidellm")
TOOL_LABELS = {
    "servegym": "ServeGym loadgen",
    "vllm": "vllm bench serve",
    "guidellm": "guidellm",
}
SATURATION = 0.97
"""A trial whose requests reached the server at under this fraction of the rate asked for
could not keep up at all (its lag grows without bound), whatever its percentiles say."""
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True, slots=True)
class SearchSettings:
    """How each tool's rate is searched and how long a trial is."""

    max_lag_ms: float
    also_lag_ms: float
    trial_seconds: float
    min_requests: int
    max_requests: int
    start_rate: float
    growth: float
    tolerance: float
    patience: int
    attempts: int
    passes: int
    min_rate: float
    max_rate: float
    max_trials: int
    budget_s: float
    warmup_fraction: float
    warmup_min: int
    input_tokens: int
    output_tokens: int

    @property
    def limits(self) -> list[float]:
        """The p99 limits searched, strict first."""
        extra = [self.also_lag_ms] if self.also_lag_ms > self.max_lag_ms else []
        return [self.max_lag_ms, *extra]

    def num_requests(self, rate: float) -> int:
        n = round(rate * self.trial_seconds)
        return max(self.min_requests, min(self.max_requests, n))

    def warmup(self, n: int) -> int:
        return min(n - 2, max(self.warmup_min, math.ceil(self.warmup_fraction * n)))


@dataclass(frozen=True, slots=True)
class Mode:
    trial_seconds: float
    min_requests: int
    growth: float
    tolerance: float
    patience: int
    attempts: int
    passes: int
    max_trials: int
    budget_s: float


FULL = Mode(3.0, 150, 2.0, 1.12, 2, 3, 2, 40, 840.0)
QUICK = Mode(1.5, 100, 4.0, 1.6, 1, 2, 1, 12, 150.0)


# --------------------------------------------------------------------------- results


@dataclass(slots=True)
class LagStats:
    """Send lag as the server saw it (ms), over the requests after warm-up, and the rate
    at which the requests arrived (first to last receipt)."""

    p50_ms: float
    p99_ms: float
    max_ms: float
    measured: int
    warmup: int
    achieved_rate: float


@dataclass(slots=True)
class Trial:
    """One run of one tool at one rate, as measured (judged later, per limit).

    ``problems`` lists what makes the trial fail at any limit: lost or failed requests, a
    tool error, a send rate below the one asked for.
    """

    rate: float
    num_requests: int
    problems: list[str]
    arrivals: int
    server_ok: int
    server_failed: int
    lag: LagStats | None
    tool_reply: dict[str, Any]
    server_cpu: float
    wall_s: float

    @property
    def self_p99(self) -> float | None:
        v = self.tool_reply.get("self_send_lag_ms_p99")
        return float(v) if isinstance(v, int | float) else None


VerdictKind = Literal["pass", "broken", "imprecise", "tail"]


@dataclass(frozen=True, slots=True)
class Verdict:
    """A trial judged against one limit.

    ``broken``: requests lost or failed, or the tool could not keep up (no retry, and
    lower rates are worth a look). ``imprecise``: the median lag alone is over the limit
    (no retry: a machine stall does not move a median). ``tail``: only the tail is over
    the limit (retried: a stall of the machine can do that).
    """

    kind: VerdictKind
    reason: str

    @property
    def passed(self) -> bool:
        return self.kind == "pass"


def judge(trial: Trial, limit_ms: float) -> Verdict:
    if trial.problems:
        return Verdict("broken", "; ".join(trial.problems))
    lag = trial.lag
    if lag is None:
        return Verdict("broken", "no lag measured")
    if lag.p50_ms > limit_ms:
        return Verdict("imprecise", f"median lag {lag.p50_ms:.3f} ms, p99 {lag.p99_ms:.3f} ms")
    if lag.p99_ms > limit_ms:
        return Verdict("tail", f"p99 lag {lag.p99_ms:.3f} ms")
    return Verdict("pass", "ok")


def rate_verdict(trials: Sequence[Trial], limit_ms: float, settings: SearchSettings) -> bool | None:
    """Whether the trials at one rate pass it at ``limit_ms``; ``None``: not decided yet.

    A ``broken`` or ``imprecise`` trial fails the rate; otherwise it passes once
    ``settings.passes`` trials pass and fails once that can no longer happen within
    ``settings.attempts`` trials.
    """
    verdicts = [judge(t, limit_ms) for t in trials]
    if any(v.kind in ("broken", "imprecise") for v in verdicts):
        return False
    passes = sum(1 for v in verdicts if v.passed)
    if passes >= settings.passes:
        return True
    if len(verdicts) - passes > settings.attempts - settings.passes:
        return False
    return None


@dataclass(slots=True)
class LimitResult:
    """One tool's answer at one limit."""

    limit_ms: float
    max_rate: float = 0.0
    best: list[Trial] = field(default_factory=list)
    fail_rate: float | None = None
    fail_reasons: list[str] = field(default_factory=list)


@dataclass(slots=True)
class ToolResult:
    """A tool's trials and, per limit, the highest rate it sustained."""

    tool: str
    label: str
    version: str = ""
    python: str = ""
    skipped: str | None = None
    error: str | None = None
    trials: list[Trial] = field(default_factory=list)
    limits: list[LimitResult] = field(default_factory=list)
    setup_s: float = 0.0

    def at(self, limit_ms: float) -> LimitResult | None:
        return next((x for x in self.limits if x.limit_ms == limit_ms), None)


def summarise(trials: Sequence[Trial], limit_ms: float, settings: SearchSettings) -> LimitResult:
    """The highest rate that passed (and its passing trials), and the lowest rate above it
    that did not pass (and why)."""
    out = LimitResult(limit_ms=limit_ms)
    by_rate: dict[float, list[Trial]] = {}
    for t in trials:
        by_rate.setdefault(t.rate, []).append(t)
    verdicts = {r: rate_verdict(ts, limit_ms, settings) for r, ts in by_rate.items()}
    passed = [r for r, v in verdicts.items() if v]
    if passed:
        out.max_rate = max(passed)
        out.best = [t for t in by_rate[out.max_rate] if judge(t, limit_ms).passed]
    above = sorted(r for r, v in verdicts.items() if not v and r > out.max_rate)
    if above:
        out.fail_rate = above[0]
        reasons = [judge(t, limit_ms) for t in by_rate[above[0]]]
        out.fail_reasons = [v.reason for v in reasons if not v.passed]
        if verdicts[above[0]] is None:
            out.fail_reasons.append("(undecided)")
    return out


# --------------------------------------------------------------------------- lag measure


def server_lag(arrivals_ns: Sequence[int], rate: float, warmup: int) -> LagStats:
    """Send lag of a constant-rate schedule from the server's receipt times.

    ``arrivals_ns`` are the receipts of one trial's ``N`` requests. Sorted, the ``i``-th
    should have come ``i/rate`` after the first; the schedule is anchored on the request
    that got through fastest (``min_i(a_i - i/rate)``), so lags are ``>= 0``. The first
    ``warmup`` requests keep their slots in the schedule but are left out of the figures.
    """
    import numpy as np

    a = np.sort(np.asarray(arrivals_ns, dtype=np.float64))
    ideal = np.arange(len(a), dtype=np.float64) * (1e9 / rate)
    meas = (a - ideal)[warmup:]
    lag_ms = (meas - meas.min()) / 1e6
    span = (a[-1] - a[warmup]) / 1e9
    achieved = (len(a) - 1 - warmup) / span if span > 0 else float("inf")
    return LagStats(
        p50_ms=float(np.percentile(lag_ms, 50)),
        p99_ms=float(np.percentile(lag_ms, 99)),
        max_ms=float(lag_ms.max()),
        measured=len(lag_ms),
        warmup=warmup,
        achieved_rate=float(achieved),
    )


def machine_stalls(seconds: float, threshold_ms: float = 0.5) -> dict[str, float]:
    """How often a spinning Python loop on this machine is stopped for > ``threshold_ms``.

    The floor under any send-lag figure: a load generator cannot be more punctual than the
    machine lets a process run. Returns stalls per second, the longest stall and the
    fraction of the time spent in stalls.
    """
    end = time.perf_counter_ns() + round(seconds * 1e9)
    limit = round(threshold_ms * 1e6)
    last = time.perf_counter_ns()
    gaps: list[int] = []
    while last < end:
        now = time.perf_counter_ns()
        if now - last > limit:
            gaps.append(now - last)
        last = now
    return {
        "seconds": seconds,
        "threshold_ms": threshold_ms,
        "stalls_per_s": len(gaps) / seconds,
        "max_ms": max(gaps, default=0) / 1e6,
        "stalled_fraction": sum(gaps) / (seconds * 1e9),
    }


# --------------------------------------------------------------------------- processes


def parse_cpus(text: str | None) -> set[int] | None:
    """``"0"``, ``"0,2"``, ``"0-1"`` -> a CPU set; ``None`` -> no pinning."""
    if not text:
        return None
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def _preexec(cpus: set[int] | None) -> Callable[[], None] | None:
    if cpus is None:
        return None

    def pin() -> None:
        os.sched_setaffinity(0, cpus)

    return pin


def _stop(proc: subprocess.Popen[Any], grace_s: float = 5.0) -> None:
    """Stop one process we started (its own process group: its children go with it)."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        proc.wait(timeout=grace_s)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process (Linux ``/proc``); 0 when unknown."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


class MockServer:
    """ServeGym's mock server in its own process, on 127.0.0.1."""

    def __init__(self, python: str, tokens_per_chunk: int, cpus: set[int] | None, log: Path):
        self.log = log
        self._log_f = log.open("w")
        argv = [python, "-m", "servegym.loadgen.mock_server", "--host", "127.0.0.1"]
        argv += ["--port", "0", "--ttft-ms", "0", "--itl-ms", "0", "--model", MODEL]
        argv += ["--tokens-per-chunk", str(tokens_per_chunk)]
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=self._log_f,
            text=True,
            start_new_session=True,
            preexec_fn=_preexec(cpus),
        )
        assert self.proc.stdout is not None
        line = _readline_within(self.proc.stdout, 60.0)
        m = re.search(r"listening on (http://\S+)", line or "")
        if m is None:
            _stop(self.proc)
            raise RuntimeError(f"mock server did not start: {line!r}; see {log}")
        self.url = m.group(1).rstrip("/")

    def _call(self, method: str, path: str) -> Any:
        req = urllib.request.Request(self.url + path, method=method)
        with _NO_PROXY.open(req, timeout=30) as resp:
            body = resp.read()
        return json.loads(body) if body else None

    def reset(self) -> None:
        self._call("POST", "/debug/reset")

    def arrivals(self) -> list[int]:
        return list(self._call("GET", "/debug/arrivals"))

    def stats(self) -> dict[str, Any]:
        return dict(self._call("GET", "/debug/stats"))

    def cpu_seconds(self) -> float:
        return _cpu_seconds(self.proc.pid)

    def close(self) -> None:
        _stop(self.proc)
        self._log_f.close()


def _readline_within(stream: IO[str], timeout_s: float) -> str | None:
    """One line from ``stream`` within ``timeout_s`` (``None`` on timeout or EOF)."""
    box: queue.Queue[str] = queue.Queue()
    t = threading.Thread(target=lambda: box.put(stream.readline()), daemon=True)
    t.start()
    try:
        return box.get(timeout=timeout_s) or None
    except queue.Empty:
        return None


class Worker:
    """One tool's long-lived worker process, spoken to in JSON lines."""

    def __init__(
        self,
        python: str,
        script: Path,
        config: dict[str, Any],
        env: dict[str, str],
        cpus: set[int] | None,
        log: Path,
    ) -> None:
        self.log = log
        self._log_f = log.open("w")
        self.proc = subprocess.Popen(
            [os.path.abspath(python), str(script), json.dumps(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log_f,
            text=True,
            env=env,
            cwd=str(script.parent),
            start_new_session=True,
            preexec_fn=_preexec(cpus),
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def receive(self, timeout_s: float) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            return {"error": f"no answer within {timeout_s:.0f} s"}
        if line is None:
            return {"error": f"worker exited (code {self.proc.poll()})"}
        return dict(json.loads(line))

    def run(self, job: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return {"error": f"worker exited (code {self.proc.poll()})"}
        return self.receive(timeout_s)

    def log_tail(self, lines: int = 15) -> str:
        self._log_f.flush()
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])

    def close(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        _stop(self.proc)
        self._log_f.close()


# --------------------------------------------------------------------------- tool discovery


def _shebang_python(exe: str) -> str | None:
    """The interpreter a console script (``vllm``, ``guidellm``) runs with."""
    try:
        with open(exe, "rb") as f:
            first = f.readline(4096).decode(errors="replace").strip()
    except OSError:
        return None
    if not first.startswith("#!"):
        return None
    parts = first[2:].split()
    if not parts:
        return None
    if Path(parts[0]).name == "env" and len(parts) > 1:
        return shutil.which(parts[1])
    return parts[0]


def find_python(
    explicit: str | None, env_var: str, command: str, flag: str
) -> tuple[str | None, str]:
    """(the tool's interpreter, where it came from) or (None, why not).

    ``explicit`` (the command-line option), else ``$env_var``, else ``command`` on PATH. A
    path whose name starts with ``python`` is taken as the interpreter itself; any other
    (a console script such as ``guidellm``) gives the interpreter named by its ``#!`` line.
    """
    given = explicit or os.environ.get(env_var)
    if given:
        path = shutil.which(given) or given
        if not Path(path).exists():
            return None, f"{given} does not exist"
        if Path(path).name.startswith("python"):
            return path, given
        py = _shebang_python(path)
        return (py, given) if py else (None, f"cannot tell the Python of {given}")
    exe = shutil.which(command)
    if exe is None:
        return None, f"'{command}' is not on PATH (give {flag} or ${env_var})"
    py = _shebang_python(exe)
    return (py, exe) if py else (None, f"cannot tell the Python of {exe}")


def tool_env(tokenizer_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "HF_HOME": str(tokenizer_dir.parent / "hf-home"),
        }
    )
    env.pop("PYTHONPATH", None)
    return env


# --------------------------------------------------------------------------- the search


def run_trial(
    server: MockServer, worker: Worker, rate: float, settings: SearchSettings, seed: int
) -> Trial:
    """Run one tool at ``rate`` for ``N`` requests and measure it on the server."""
    n = settings.num_requests(rate)
    server.reset()
    before = server.stats()
    cpu0, t0 = server.cpu_seconds(), time.perf_counter()
    job = {"rate": rate, "num_requests": n, "seed": seed}
    reply = worker.run(job, timeout_s=180.0 + 3.0 * n / rate)
    wall = time.perf_counter() - t0
    cpu = server.cpu_seconds() - cpu0
    after = server.stats()
    arrivals = server.arrivals()
    server_ok = int(after["success"]) - int(before["success"])
    server_failed = int(after["failed"]) - int(before["failed"])
    reply.pop("argv", None)
    problems: list[str] = []
    if "error" in reply:
        problems.append(f"tool error: {reply['error']}")
    if len(arrivals) < n:
        problems.append(f"only {len(arrivals)} of {n} requests reached the server")
    if server_ok < n or server_failed:
        problems.append(f"server completed {server_ok} of {n} ({server_failed} failed)")
    tool_failed = int(reply.get("failed", 0) or 0)
    tool_completed = reply.get("completed")
    if tool_failed or (tool_completed is not None and int(tool_completed) < n):
        problems.append(f"tool reported {tool_completed} completed, {tool_failed} failed")
    lag: LagStats | None = None
    if len(arrivals) >= 3:
        use = sorted(arrivals)[-n:]
        lag = server_lag(use, rate, settings.warmup(len(use)))
        if lag.achieved_rate < SATURATION * rate:
            problems.append(
                f"cannot keep up: sent {_fmt_rate(lag.achieved_rate)} req/s, "
                f"p99 lag {lag.p99_ms:.1f} ms"
            )
    return Trial(
        rate=rate,
        num_requests=n,
        problems=problems,
        arrivals=len(arrivals),
        server_ok=server_ok,
        server_failed=server_failed,
        lag=lag,
        tool_reply=reply,
        server_cpu=cpu / wall if wall > 0 else 0.0,
        wall_s=wall,
    )


def _round_rate(r: float) -> float:
    """Three significant figures, so the rates tried read cleanly."""
    if r <= 0:
        return r
    return round(r, 2 - math.floor(math.log10(r)))


class RateSearch:
    """One tool's search at one p99 limit: where it stands and the rate to try next.

    Ladder: ``start, start*g, start*g^2, ...`` while rungs pass. A failing rung ends the
    ladder when the tool is ``broken`` there, or after ``patience`` failing rungs in a row
    (one more before any rung passed: at low rates an idle machine wakes up slowly, so a
    tool can fail low and pass higher). No pass yet and ``broken``: the ladder goes down
    instead. Then bisection (geometric) between the highest passing rate and the lowest
    failing one above it. A rate is decided as :func:`rate_verdict` says.
    """

    def __init__(self, settings: SearchSettings, limit_ms: float) -> None:
        self.s = settings
        self.limit_ms = limit_ms
        self.seen: list[Trial] = []
        self.verdicts: dict[float, bool] = {}
        self.phase: Literal["ladder", "bisect", "done"] = "ladder"
        self.rung: float = settings.start_rate
        self.pending: float | None = None
        self.failing_rungs = 0
        self.going_down = False

    def tries(self, rate: float) -> int:
        return sum(1 for t in self.seen if t.rate == rate)

    @property
    def lo(self) -> float | None:
        ok = [r for r, v in self.verdicts.items() if v]
        return max(ok) if ok else None

    @property
    def hi(self) -> float | None:
        lo = self.lo or 0.0
        bad = [r for r, v in self.verdicts.items() if not v and r > lo]
        return min(bad) if bad else None

    def next_rate(self) -> float | None:
        if self.pending is not None:
            return self.pending
        if self.phase == "ladder":
            return self.rung
        if self.phase == "bisect":
            lo, hi = self.lo, self.hi
            if lo is None or hi is None or hi / lo <= self.s.tolerance:
                return None
            mid = _round_rate(math.sqrt(lo * hi))
            return None if mid in self.verdicts else mid
        return None

    def feed(self, trial: Trial) -> None:
        self.seen.append(trial)
        r = trial.rate
        at_rate = [t for t in self.seen if t.rate == r]
        verdict = rate_verdict(at_rate, self.limit_ms, self.s)
        if verdict is None:
            self.pending = r
            return
        self.pending = None
        self.verdicts[r] = verdict
        if self.phase == "ladder":
            kind: VerdictKind = "pass" if verdict else "tail"
            for t in at_rate:
                v = judge(t, self.limit_ms)
                if not verdict and v.kind in ("broken", "imprecise"):
                    kind = v.kind
            self._climb(r, Verdict(kind, ""))

    def _climb(self, r: float, v: Verdict) -> None:
        g = self.s.growth
        if v.passed:
            self.failing_rungs = 0
            if self.going_down or r >= self.s.max_rate:
                self.phase = "bisect"
            else:
                self.rung = min(self.s.max_rate, _round_rate(r * g))
            return
        self.failing_rungs += 1
        if self.lo is None and (v.kind == "broken" or self.going_down):
            self.going_down = True
            down = _round_rate(r / g)
            if down < self.s.min_rate:
                self.phase = "done"
            else:
                self.rung = down
            return
        patience = self.s.patience if self.lo is not None else self.s.patience + 1
        if v.kind == "broken" or self.failing_rungs >= patience or r >= self.s.max_rate:
            self.phase = "bisect" if self.lo is not None else "done"
        else:
            self.rung = min(self.s.max_rate, _round_rate(r * g))


class ToolRun:
    """One tool's searches (one per limit), sharing its trials: a search that wants a rate
    already tried takes those trials before a new one is run."""

    def __init__(self, result: ToolResult, worker: Worker, settings: SearchSettings) -> None:
        self.result = result
        self.worker = worker
        self.settings = settings
        self.searches = [RateSearch(settings, limit) for limit in settings.limits]
        self.by_rate: dict[float, list[Trial]] = {}

    def step(self, server: MockServer, seed: int) -> Trial | None:
        """Run the next trial any search needs; ``None`` when every search is done."""
        for _ in range(10_000):  # each pass feeds a cached trial or returns
            search = next((s for s in self.searches if s.next_rate() is not None), None)
            if search is None:
                return None
            rate = search.next_rate()
            assert rate is not None
            cached = self.by_rate.get(rate, [])
            used = search.tries(rate)
            if used < len(cached):
                search.feed(cached[used])
                continue
            if len(self.result.trials) >= self.settings.max_trials:
                return None
            trial = run_trial(server, self.worker, rate, self.settings, seed)
            self.by_rate.setdefault(rate, []).append(trial)
            self.result.trials.append(trial)
            search.feed(trial)
            return trial
        return None


def _fmt_rate(r: float) -> str:
    return f"{r:,.0f}" if r >= 100 else f"{r:,.1f}"


def _fmt_limit(limit_ms: float) -> str:
    return f"{limit_ms:g} ms"


def describe(tool: str, trial: Trial, limits: Sequence[float]) -> str:
    """One line per trial, as the search goes."""
    if trial.lag is not None:
        lag = f"p50 {trial.lag.p50_ms:7.3f} p99 {trial.lag.p99_ms:8.3f} ms"
    else:
        lag = "p50       - p99        - ms"
    if trial.self_p99 is not None:
        lag += f" (self p99 {trial.self_p99:.3f})"
    verdicts = []
    for limit in limits:
        v = judge(trial, limit)
        verdicts.append(f"{_fmt_limit(limit)}: {'pass' if v.passed else 'FAIL'}")
    why = "; ".join(trial.problems)
    return (
        f"  [{tool:8}] {_fmt_rate(trial.rate):>7} req/s x {trial.num_requests:>6}: {lag}, "
        f"server CPU {trial.server_cpu:3.0%}, {trial.wall_s:4.1f} s -> {', '.join(verdicts)}"
        + (f" ({why})" if why else "")
    )


# --------------------------------------------------------------------------- report


def _ratio(sg: float, other: float) -> str:
    if other <= 0:
        return "inf" if sg > 0 else "-"
    return f"{sg / other:.2f}x"


def _summary_line(results: Sequence[ToolResult], limit_ms: float) -> str:
    sg = next((r for r in results if r.tool == "servegym"), None)
    sg_at = sg.at(limit_ms) if sg else None
    others = [(r, r.at(limit_ms)) for r in results if r.tool != "servegym"]
    ran = [(r, x) for r, x in others if x is not None]
    if sg_at is None or not ran:
        return "n/a (no other tool ran)"
    top, top_at = max(ran, key=lambda rx: rx[1].max_rate if rx[1] else 0.0)
    assert top_at is not None
    other_rate = _fmt_rate(top_at.max_rate) if top_at.best else "none"
    return (
        f"{_ratio(sg_at.max_rate, top_at.max_rate)} ({_fmt_rate(sg_at.max_rate)} vs "
        f"{other_rate} req/s, {top.label})"
    )


def render(results: Sequence[ToolResult], settings: SearchSettings, notes: Sequence[str]) -> str:
    """Print the table (Rich when available) and notes; return the final summary line."""
    limits = settings.limits
    sg = next((r for r in results if r.tool == "servegym"), None)
    headers = ["tool", "version"]
    for limit in limits:
        p = f"p99 <= {_fmt_limit(limit)}"
        headers += [f"{p}: max rate (req/s)", f"{p}: p99 lag there (ms)", f"{p}: ServeGym / tool"]
    headers.append("trials")
    rows: list[list[str]] = []
    whys: list[str] = []
    skips: list[str] = []
    for r in results:
        if r.skipped or not r.limits:
            why = r.skipped or r.error or "no trial ran"
            rows.append([r.label, r.version or "-", *(["skipped", "-", "-"] * len(limits)), "0"])
            skips.append(f"{r.label}: {why}")
            continue
        row = [r.label, r.version]
        for limit in limits:
            x = r.at(limit)
            assert x is not None
            sg_at = sg.at(limit) if sg else None
            sg_rate = sg_at.max_rate if sg_at else 0.0
            if not x.best:
                row += ["none passed", "-", "-" if r.tool == "servegym" else _ratio(sg_rate, 0.0)]
            else:
                p99 = " / ".join(f"{t.lag.p99_ms:.3f}" for t in x.best if t.lag)
                selfs = [t.self_p99 for t in x.best if t.self_p99 is not None]
                if selfs:
                    p99 += " (self " + " / ".join(f"{v:.3f}" for v in selfs) + ")"
                ratio = "1.00x" if r.tool == "servegym" else _ratio(sg_rate, x.max_rate)
                row += [_fmt_rate(x.max_rate), p99, ratio]
            if x.fail_rate is not None:
                whys.append(
                    f"{r.label} at p99 <= {_fmt_limit(limit)}: {_fmt_rate(x.fail_rate)} req/s "
                    f"failed: {' / '.join(x.fail_reasons)}"
                )
        row.append(str(len(r.trials)))
        rows.append(row)
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(" | ".join(headers))
        for row in rows:
            print(" | ".join(row))
    else:
        table = Table(title="Load-generator capacity: highest constant rate within a p99 send lag")
        for h in headers:
            table.add_column(h, overflow="fold")
        for row in rows:
            table.add_row(*row)
        Console(width=max(140, shutil.get_terminal_size().columns)).print(table)
    for w in skips:
        print(f"skipped: {w}")
    for w in whys:
        print(f"why not higher: {w}")
    for n in notes:
        print(f"note: {n}")
    for limit in limits[1:]:
        print(
            f"at p99 <= {_fmt_limit(limit)}: ServeGym / best other = "
            f"{_summary_line(results, limit)}"
        )
    summary = f"ServeGym / best other = {_summary_line(results, limits[0])}"
    print(summary)
    return summary


# --------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=(
            "Highest constant request rate each load generator sustains against ServeGym's "
            "mock server with p99 send lag <= --max-lag-ms (measured on the server)."
        )
    )
    p.add_argument("--quick", action="store_true", help="shorter trials, coarser search")
    p.add_argument("--tools", default=",".join(TOOLS), help="comma list of " + ",".join(TOOLS))
    p.add_argument(
        "--vllm-python",
        help="Python of an environment with vLLM (default: $SERVEGYM_VLLM_PYTHON, else the "
        "interpreter of 'vllm' on PATH)",
    )
    p.add_argument(
        "--guidellm",
        help="guidellm command or the Python of its environment (default: $SERVEGYM_GUIDELLM, "
        "else 'guidellm' on PATH)",
    )
    p.add_argument("--servegym-python", default=sys.executable, help="Python with servegym")
    p.add_argument("--max-lag-ms", type=float, default=1.0, help="p99 send-lag limit")
    p.add_argument(
        "--also-lag-ms", type=float, default=5.0, help="a looser limit also reported (0: none)"
    )
    p.add_argument("--trial-seconds", type=float, help="schedule length of one trial")
    p.add_argument("--start-rate", type=float, default=50.0, help="first rate tried (req/s)")
    p.add_argument("--growth", type=float, help="ladder factor between rungs")
    p.add_argument("--tolerance", type=float, help="stop bisecting at fail/pass <= this")
    p.add_argument("--patience", type=int, help="failing rungs that end the ladder")
    p.add_argument("--attempts", type=int, help="most trials one rate gets")
    p.add_argument("--passes", type=int, help="passing trials that pass a rate")
    p.add_argument("--max-rate", type=float, default=50_000.0)
    p.add_argument("--max-trials", type=int, help="per tool")
    p.add_argument("--budget-s", type=float, help="start no trial after this many seconds")
    p.add_argument("--input-tokens", type=int, default=8)
    p.add_argument("--output-tokens", type=int, default=4)
    p.add_argument("--server-cpus", help="pin the mock server to these CPUs, e.g. 0")
    p.add_argument("--tool-cpus", help="pin the tools' workers to these CPUs, e.g. 1")
    p.add_argument("--json", type=Path, help="write every trial and the summary here")
    p.add_argument("--keep-logs", action="store_true", help="keep the folder of logs")
    return p


def settings_from_args(args: argparse.Namespace) -> SearchSettings:
    m = QUICK if args.quick else FULL

    def pick(value: Any, default: Any) -> Any:
        return default if value is None else value

    return SearchSettings(
        max_lag_ms=args.max_lag_ms,
        also_lag_ms=args.also_lag_ms,
        trial_seconds=pick(args.trial_seconds, m.trial_seconds),
        min_requests=m.min_requests,
        max_requests=40_000,
        start_rate=args.start_rate,
        growth=pick(args.growth, m.growth),
        tolerance=pick(args.tolerance, m.tolerance),
        patience=pick(args.patience, m.patience),
        attempts=pick(args.attempts, m.attempts),
        passes=pick(args.passes, m.passes),
        min_rate=5.0,
        max_rate=args.max_rate,
        max_trials=pick(args.max_trials, m.max_trials),
        budget_s=pick(args.budget_s, m.budget_s),
        warmup_fraction=0.1,
        warmup_min=10,
        input_tokens=args.input_tokens,
        output_tokens=args.output_tokens,
    )


def _start_workers(
    args: argparse.Namespace,
    wanted: Sequence[str],
    config: dict[str, Any],
    env: dict[str, str],
    cpus: set[int] | None,
    tmp: Path,
    log: Callable[[str], None],
) -> tuple[list[ToolResult], dict[str, Worker]]:
    """Start every tool's worker at once (their imports overlap); wait until each is ready."""
    results: list[ToolResult] = []
    workers: dict[str, Worker] = {}
    started: dict[str, float] = {}
    for tool in wanted:
        res = ToolResult(tool=tool, label=TOOL_LABELS[tool])
        results.append(res)
        python: str | None
        if tool == "servegym":
            python, where = args.servegym_python, "--servegym-python"
        elif tool == "vllm":
            python, where = find_python(
                args.vllm_python, "SERVEGYM_VLLM_PYTHON", "vllm", "--vllm-python"
            )
        else:
            python, where = find_python(
                args.guidellm, "SERVEGYM_GUIDELLM", "guidellm", "--guidellm"
            )
        if python is None:
            res.skipped = f"not installed: {where}"
            log(f"[{tool}] skipped: {res.skipped}")
            continue
        res.python = os.path.abspath(python)
        log(f"[{tool}] starting worker: {res.python}")
        started[tool] = time.perf_counter()
        script = HERE / f"_worker_{tool}.py"
        workers[tool] = Worker(res.python, script, config, env, cpus, tmp / f"{tool}.log")
    for res in results:
        w = workers.get(res.tool)
        if w is None:
            continue
        ready = w.receive(timeout_s=300.0)
        res.setup_s = time.perf_counter() - started[res.tool]
        if not ready.get("ready"):
            res.skipped = f"cannot load: {ready.get('error', 'no answer')}"
            log(f"[{res.tool}] skipped: {res.skipped}")
            tail = w.log_tail(5)
            if tail:
                log(tail)
            w.close()
            del workers[res.tool]
            continue
        res.version = str(ready.get("version", ""))
        log(f"[{res.tool}] {res.version} ready after {res.setup_s:.1f} s")
    return results, workers


def _interleaved_search(
    results: Sequence[ToolResult],
    workers: dict[str, Worker],
    server: MockServer,
    settings: SearchSettings,
    deadline: float,
    log: Callable[[str], None],
) -> bool:
    """Tools take turns, one trial each per round. Returns False when out of time."""
    runs = [ToolRun(r, workers[r.tool], settings) for r in results if r.tool in workers]
    active = list(runs)
    seed = 0
    try:
        while active:
            for run in list(active):
                if time.perf_counter() > deadline:
                    return False
                seed += 1
                trial = run.step(server, seed)
                if trial is None:
                    active.remove(run)
                    continue
                log(describe(run.result.tool, trial, settings.limits))
                if run.worker.proc.poll() is not None:
                    run.result.error = f"worker exited: {'; '.join(trial.problems)}"
                    log(run.worker.log_tail())
                    active.remove(run)
        return True
    finally:
        for run in runs:
            run.result.limits = [summarise(run.result.trials, x, settings) for x in settings.limits]


def _notes(
    results: Sequence[ToolResult],
    settings: SearchSettings,
    ncpu: int,
    pinning: str,
    stalls: Sequence[dict[str, float]],
    finished: bool,
) -> list[str]:
    notes = [
        f"one mock server process served every tool; it and the tool under test shared this "
        f"machine's {ncpu} CPUs ({pinning}); the tools took turns, never ran at once",
        "lag is measured on the server for every tool (receipt vs a constant-rate schedule "
        "anchored on the fastest request, p99 after a 10% warm-up), so it includes the "
        "server's own time to accept a request; ServeGym's self-reported p99 (sent - "
        "scheduled) is in brackets",
    ]
    if stalls:
        worst = max(stalls, key=lambda s: s["stalled_fraction"])
        notes.append(
            "machine noise: a spinning Python loop was stopped for > "
            f"{worst['threshold_ms']:g} ms {worst['stalls_per_s']:.1f} times a second (longest "
            f"{worst['max_ms']:.1f} ms, {worst['stalled_fraction']:.2%} of the time); stalls "
            f"like these alone can push a p99 past {_fmt_limit(settings.max_lag_ms)}, hence "
            f"a rate passes when {settings.passes} of its (at most {settings.attempts}) trials pass"
        )
    if not finished:
        notes.append(f"time budget of {settings.budget_s:.0f} s reached: searches cut short")
    sg = next((r for r in results if r.tool == "servegym"), None)
    strict = sg.at(settings.max_lag_ms) if sg else None
    if sg is not None and strict is not None and strict.fail_rate is not None:
        tries = [t for t in sg.trials if t.rate == strict.fail_rate]
        selfs = [t.self_p99 for t in tries]
        lags = [t.lag.p99_ms for t in tries if t.lag]
        if tries and all(x is not None and x <= settings.max_lag_ms for x in selfs) and lags:
            cpu = max(t.server_cpu for t in tries)
            top_self = max(x for x in selfs if x is not None)
            notes.append(
                f"at {_fmt_rate(strict.fail_rate)} req/s ServeGym kept its own schedule "
                f"(self-reported p99 <= {top_self:.3f} ms) but the server received requests "
                f"late (p99 {min(lags):.3f} ms at best, server CPU up to {cpu:.0%}): the "
                "delay is after the send (kernel, server, shared CPUs), so ServeGym's figure "
                "is a lower bound of the generator's own"
            )
    return notes


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = settings_from_args(args)
    wanted = [t.strip() for t in args.tools.split(",") if t.strip()]
    unknown = [t for t in wanted if t not in TOOLS]
    if unknown:
        print(f"error: unknown tool(s) {', '.join(unknown)}; known: {', '.join(TOOLS)}")
        return 2
    try:
        server_cpus, tool_cpus = parse_cpus(args.server_cpus), parse_cpus(args.tool_cpus)
    except ValueError:
        print("error: --server-cpus/--tool-cpus take lists like 0 or 0,1 or 0-1")
        return 2

    def log(msg: str) -> None:
        print(msg, flush=True)

    started = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="servegym-capacity-"))
    ncpu = len(os.sched_getaffinity(0))
    pinning = (
        f"server on CPUs {sorted(server_cpus) if server_cpus else 'any'}, "
        f"tools on {sorted(tool_cpus) if tool_cpus else 'any'}"
    )
    log(
        f"Load-generator capacity: {settings.input_tokens} prompt / {settings.output_tokens} "
        f"output tokens in one chunk, TTFT/ITL 0; trials of {settings.trial_seconds:g} s "
        f"(>= {settings.min_requests} requests); limits p99 <= "
        f"{', '.join(_fmt_limit(x) for x in settings.limits)}; {ncpu} CPUs ({pinning}); "
        f"logs in {tmp}"
    )
    stalls = [machine_stalls(2.0)]
    tok_dir = build_tokenizer(tmp / "tokenizer")
    server = MockServer(
        args.servegym_python, settings.output_tokens, server_cpus, tmp / "mock_server.log"
    )
    log(f"mock server at {server.url} (pid {server.proc.pid})")
    config = {
        "base_url": server.url,
        "model": MODEL,
        "tokenizer": str(tok_dir),
        "input_tokens": settings.input_tokens,
        "output_tokens": settings.output_tokens,
    }
    workers: dict[str, Worker] = {}
    results: list[ToolResult] = []
    try:
        results, workers = _start_workers(
            args, wanted, config, tool_env(tok_dir), tool_cpus, tmp, log
        )
        deadline = started + settings.budget_s
        finished = _interleaved_search(results, workers, server, settings, deadline, log)
    finally:
        for w in workers.values():
            w.close()
        server.close()
    stalls.append(machine_stalls(2.0))
    notes = _notes(results, settings, ncpu, pinning, stalls, finished)
    log("")
    summary = render(results, settings, notes)
    log(f"total {time.perf_counter() - started:.0f} s")
    if args.json:
        doc = {
            "settings": asdict(settings),
            "cpus": ncpu,
            "pinning": pinning,
            "machine_stalls": stalls,
            "results": [asdict(r) for r in results],
            "notes": notes,
            "summary": summary,
        }
        args.json.write_text(json.dumps(doc, indent=2, default=str))
        log(f"wrote {args.json}")
    if args.keep_logs or any(r.error for r in results):
        log(f"logs kept in {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
