"""The CPU time of ``servegym --help``: the cost of starting the command line.

Runs ``python -m servegym --help`` (or the given arguments before ``--help``, e.g. ``run``)
``--repeat`` times in fresh interpreters and prints the median user+sys CPU seconds of the
child, then the slowest imports of one ``-X importtime`` run. The issue's target is at most
0.5 s; each command imports what it runs inside its function, so ``--help`` never pays for
pandas, optuna, the provider SDKs or the engines.

    .venv/bin/python benchmarks/cli_cold_start.py [--repeat 7] [GROUP ...]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys


def cpu_seconds(argv: list[str]) -> float:
    """User+sys CPU seconds of one child process running ``argv`` to the end."""
    pid = os.fork()
    if pid == 0:  # the child: silence it and become the command
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os.execv(argv[0], argv)
    _, status, usage = os.wait4(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv)} failed (status {status})")
    return usage.ru_utime + usage.ru_stime


def slowest_imports(argv: list[str], top: int) -> list[tuple[int, str]]:
    """The ``top`` imports with the largest cumulative time (microseconds) in one run."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *argv[1:]], capture_output=True, text=True
    )
    rows: list[tuple[int, str]] = []
    for line in done.stderr.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \|(\s*)(\S+)", line)
        if m and len(m.group(2)) <= 2:  # top-level imports only
            rows.append((int(m.group(1)), m.group(3)))
    return sorted(rows, reverse=True)[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7, help="fresh interpreters to time")
    parser.add_argument("--top", type=int, default=8, help="slowest imports to list")
    parser.add_argument("group", nargs="*", help="command words before --help, e.g. task")
    args = parser.parse_args()
    argv = [sys.executable, "-m", "servegym", *args.group, "--help"]
    times = [cpu_seconds(argv) for _ in range(args.repeat)]
    label = " ".join(["servegym", *args.group, "--help"])
    print(
        f"{label}: median {statistics.median(times):.3f} s CPU (user+sys) over {args.repeat} "
        f"runs, min {min(times):.3f}, max {max(times):.3f}"
    )
    print("slowest top-level imports (cumulative, one run):")
    for us, name in slowest_imports(argv, args.top):
        print(f"  {us / 1e6:7.3f} s  {name}")


if __name__ == "__main__":
    main()
