#!/usr/bin/env python3
"""``servegym-agent``: the agent's command inside its sandbox, for a CLI agent's session.

    servegym-agent benchmark [--quick]   start ./start_server.sh (a pipeline task: run
                                         ./serving.toml), run the dev workload, report
    servegym-agent submit                snapshot the workspace as the submission (a
                                         pipeline task: submit ./serving.toml)
    servegym-agent budget                what is spent and what is left

Each subcommand is one HTTP call to the trial's control server on the harness side (see
:mod:`servegym.agents.cli.control`), which does the work and charges the budget. The server's
address and this trial's control token come from ``SERVEGYM_CONTROL_URL`` and
``SERVEGYM_CONTROL_TOKEN`` (the token is no API key: it reaches only this trial's control
server). The answer is printed as JSON on stdout.

Exit codes: 0 done; 1 the call was refused (the budget is spent, no ``start_server.sh``,
a benchmark running and another waiting ...), with the reason on stderr; 2 a usage or
connection error, in one line on stderr.

This file uses the Python standard library only and never imports ServeGym: the harness
copies it into the sandbox, where ServeGym is not installed. It also runs as
``python -m servegym.agents.cli.servegym_agent``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

URL_ENV = "SERVEGYM_CONTROL_URL"
TOKEN_ENV = "SERVEGYM_CONTROL_TOKEN"
PROG = "servegym-agent"
EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
TIMEOUT_S = 6 * 3600.0
"""A benchmark starts a server and runs a workload: it may take long."""


class CallError(Exception):
    """A call that failed; ``code`` is the exit code to end with."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def call(
    method: str,
    path: str,
    body: Mapping[str, Any] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    timeout_s: float = TIMEOUT_S,
) -> Any:
    """One call to the control server; its JSON answer, or :class:`CallError`."""
    env = os.environ if environ is None else environ
    base = env.get(URL_ENV, "").strip()
    token = env.get(TOKEN_ENV, "").strip()
    if not base:
        raise CallError(f"{URL_ENV} is not set (it is set in a ServeGym agent's sandbox)", 2)
    if not token:
        raise CallError(f"{TOKEN_ENV} is not set (it is set in a ServeGym agent's sandbox)", 2)
    data = None if body is None else json.dumps(body).encode("utf-8")
    request = urllib.request.Request(
        base.rstrip("/") + path,
        data=data,
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read().decode("utf-8") or "null")
    except urllib.error.HTTPError as e:
        message = _error_message(e)
        if e.code == 401:
            raise CallError(f"the control server refused {TOKEN_ENV}: {message}", 2) from None
        raise CallError(message, EXIT_REFUSED) from None
    except urllib.error.URLError as e:
        raise CallError(f"cannot reach the control server at {base}: {e.reason}", 2) from None
    except (OSError, ValueError) as e:  # a timeout, a reset connection, a non-JSON answer
        raise CallError(f"the call to the control server at {base} failed: {e}", 2) from None


def _error_message(e: urllib.error.HTTPError) -> str:
    try:
        text = e.read().decode("utf-8", errors="replace")
    except OSError:
        text = ""
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("error"), str):
        return str(data["error"])
    return f"HTTP {e.code} {e.reason}" + (f": {text.strip()[:500]}" if text.strip() else "")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Benchmark and submit this workspace's server (a ServeGym trial).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    bench = sub.add_parser(
        "benchmark",
        help="start ./start_server.sh (a pipeline task: deploy ./serving.toml), run the dev "
        "workload against it, report (charged)",
    )
    bench.add_argument("--quick", action="store_true", help="a shorter workload: cheaper, noisier")
    sub.add_parser(
        "submit",
        help="snapshot the workspace as the submission (a pipeline task: ./serving.toml; "
        "the last stands)",
    )
    sub.add_parser("budget", help="what is spent and what is left")
    return parser


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    args = _parser().parse_args(argv)  # exits with 2 on a usage error
    try:
        if args.command == "benchmark":
            answer = call("POST", "/benchmark", {"quick": bool(args.quick)}, environ=environ)
        elif args.command == "submit":
            answer = call("POST", "/submit", {}, environ=environ)
        else:
            answer = call("GET", "/budget", environ=environ)
    except CallError as e:
        print(f"{PROG}: {e.message}", file=sys.stderr)
        return e.code
    print(json.dumps(answer, indent=2))
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
