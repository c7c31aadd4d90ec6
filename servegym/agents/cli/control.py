"""The control server: the harness side of ``servegym-agent``.

A CLI agent runs in its sandbox and reaches its task through three HTTP calls, made by the
``servegym-agent`` command (:mod:`servegym.agents.cli.servegym_agent`):

- ``POST /benchmark`` with ``{"quick": bool}``: :meth:`WorkspaceEnvironment.run_benchmark`
  in a worker thread; a compact JSON answer (the experiment's index, ``ok``, objective,
  improvement, accuracy ratio, a few p50/p99 figures, the launch error, the last 2,000
  characters of the server log, and the budget line). One benchmark at a time: a second one
  asked for while one runs waits its turn (a CLI that moves a long command to the background,
  as Codex's ``exec_command`` does after a short wait, and then benchmarks again gets both
  results in order, never a refusal it would have to puzzle out); one waiter at most, so a
  third is refused with 409. A waiter whose client has gone away before its turn is dropped
  unrun and uncharged.
- ``POST /submit``: :meth:`WorkspaceEnvironment.submit_workspace`; its one-line summary.
- ``GET /budget``: the :class:`BudgetState` and a line for humans.

Every request must carry ``Authorization: Bearer <token>``, the trial's random control token
(:func:`secrets.token_urlsafe`); others get 401. A spent budget is a 409, a
:class:`WorkspaceError` a 400, each with ``{"error": message}``. Every call is passed to
``on_call`` (kind ``tool``, name, arguments, result, status) for the trial's trajectory.
Any other exception of the environment is a 500 and is kept in :attr:`ControlServer.failure`
for the agent to raise in the trial's thread.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import secrets
import threading
from collections.abc import Callable
from typing import Any, Protocol, Self

from aiohttp import web

from servegym.agents.base import (
    BudgetExhausted,
    BudgetState,
    ExperimentResult,
)
from servegym.agents.llm.tools import experiment_summary
from servegym.aio_serve import serve_app
from servegym.sandbox.workspace import WorkspaceError

LOG_TAIL_CHARS = 2000
"""The benchmark answer carries at most this much of the server log's end."""

MAX_WAITING_BENCHMARKS = 1
"""Benchmarks that may wait behind the running one; more are refused (409)."""

WAIT_POLL_S = 0.2
"""How often a waiting benchmark looks for its turn (and for its client having gone)."""

CallLog = Callable[[dict[str, Any]], None]


class ControlledTask(Protocol):
    """What the control server drives: a real track's
    :class:`~servegym.agents.base.WorkspaceEnvironment`, or a sim task's config folder
    (:class:`~servegym.agents.cli.config_folder.ConfigFolderTask`)."""

    def run_benchmark(self, quick: bool = False) -> ExperimentResult: ...

    def submit_workspace(self) -> str: ...

    def budget_left(self) -> BudgetState: ...


def budget_line(b: BudgetState) -> str:
    """The budget in one line, wall time in minutes (what a CLI agent plans with)."""
    parts = [f"{b.experiments_run} benchmark{'s' if b.experiments_run != 1 else ''} run"]
    if b.experiments_left is not None:
        parts.append(f"{b.experiments_left} left")
    if b.wall_seconds_left is not None:
        parts.append(f"{max(0.0, b.wall_seconds_left) / 60:.1f} minutes of benchmark time left")
    if b.sim_gpu_seconds_left is not None:
        parts.append(f"{b.sim_gpu_seconds_left:,.0f} simulated GPU-seconds left")
    line = "budget: " + ", ".join(parts)
    return line + (" (spent: submit your best)" if b.exhausted else "")


def benchmark_summary(r: ExperimentResult, budget: BudgetState) -> dict[str, Any]:
    """What the agent is told about one benchmark (what a model agent's tool says)."""
    out = experiment_summary(r, LOG_TAIL_CHARS)
    out["budget"] = budget_line(budget)
    return out


class ControlServer:
    """The HTTP control server of one trial (start it on a running event loop)."""

    def __init__(
        self,
        env: ControlledTask,
        *,
        token: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        on_call: CallLog | None = None,
    ) -> None:
        self.env = env
        self.token = token or secrets.token_urlsafe(32)
        self.host = host
        self.port = port
        self.on_call = on_call
        self.calls = 0
        self.failure: BaseException | None = None
        """An exception of the environment's own (not the agent's doing), if one was raised."""
        self._env_lock = threading.Lock()
        """One environment call at a time; released by the thread that ran the call."""
        self._waiting = 0
        """Benchmarks waiting for the running one (on the event loop, so no lock)."""
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` as bound (once started)."""
        if self._runner is None:
            raise RuntimeError("the control server is not started")
        return f"http://{self.host}:{self.port}"

    def url_for(self, host: str) -> str:
        """The server's URL with another host name (as a container reaches it)."""
        return f"http://{host}:{self.port}"

    async def start(self) -> Self:
        app = web.Application(client_max_size=1024 * 1024, middlewares=[self._auth])
        app.router.add_post("/benchmark", self._benchmark)
        app.router.add_post("/submit", self._submit)
        app.router.add_get("/budget", self._budget)
        self._runner, self.port = await serve_app(app, self.host, self.port)
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ------------------------------------------------------------------ handlers

    @web.middleware
    async def _auth(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Any],
    ) -> web.StreamResponse:
        given = request.headers.get("Authorization", "")
        scheme, _, value = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            value.strip().encode(), self.token.encode()
        ):
            return _error(401, "missing or wrong control token")
        response: web.StreamResponse = await handler(request)
        return response

    async def _benchmark(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        if isinstance(body, web.Response):
            return body
        quick = body.get("quick", False)
        if not isinstance(quick, bool):
            return self._logged("benchmark", body, _error(400, "'quick' must be true or false"))
        if not self._env_lock.acquire(blocking=False):
            if self._waiting >= MAX_WAITING_BENCHMARKS:
                return self._logged(
                    "benchmark",
                    {"quick": quick},
                    _error(
                        409,
                        "a benchmark is running and another is waiting for it; wait for "
                        "them to finish",
                    ),
                )
            self._waiting += 1
            try:
                while not self._env_lock.acquire(blocking=False):
                    await asyncio.sleep(WAIT_POLL_S)
                    if _client_gone(request):
                        return self._logged(
                            "benchmark",
                            {"quick": quick},
                            _error(409, "dropped unrun: the caller went away while it waited"),
                        )
            finally:
                self._waiting -= 1
        # The thread releases the lock when the benchmark ends, even if this handler is
        # cancelled first, so a second benchmark can never start beside a running one.
        response = await asyncio.to_thread(self._run_benchmark_and_release, quick)
        return self._logged("benchmark", {"quick": quick}, response)

    @property
    def busy(self) -> bool:
        """Whether a benchmark or a submit is running (it charges the budget itself)."""
        return self._env_lock.locked()

    def _run_benchmark_and_release(self, quick: bool) -> web.Response:
        try:
            return self._run_benchmark(quick)
        finally:
            self._env_lock.release()

    def _run_benchmark(self, quick: bool) -> web.Response:
        try:
            result = self.env.run_benchmark(quick=quick)
        except BudgetExhausted as e:
            return _error(409, _spent(e))
        except WorkspaceError as e:
            return _error(400, str(e))
        except Exception as e:  # the harness failed, not the agent: the trial will say so
            self.failure = e
            return _error(500, f"harness error: {type(e).__name__}: {e}")
        return web.json_response(benchmark_summary(result, self.env.budget_left()))

    async def _submit(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        if isinstance(body, web.Response):
            return body
        response = await asyncio.to_thread(self._run_submit)
        return self._logged("submit", {}, response)

    def _run_submit(self) -> web.Response:
        with self._env_lock:
            try:
                summary = self.env.submit_workspace()
            except WorkspaceError as e:
                return _error(400, str(e))
            except Exception as e:
                self.failure = e
                return _error(500, f"harness error: {type(e).__name__}: {e}")
        return web.json_response({"submitted": summary})

    async def _budget(self, request: web.Request) -> web.Response:
        b = self.env.budget_left()
        answer = {"budget": b.model_dump(), "exhausted": b.exhausted, "line": budget_line(b)}
        return self._logged("budget", {}, web.json_response(answer))

    def _logged(self, name: str, arguments: dict[str, Any], response: web.Response) -> web.Response:
        self.calls += 1
        if self.on_call is not None:
            try:
                result: Any = json.loads(response.text or "null")
            except ValueError:
                result = response.text
            self.on_call(
                {
                    "kind": "tool",
                    "name": name,
                    "arguments": arguments,
                    "result": result,
                    "status": response.status,
                    "is_error": response.status >= 400,
                }
            )
        return response


def _client_gone(request: web.Request) -> bool:
    """Whether the caller's connection is closed (its command was killed while it waited)."""
    transport = request.transport
    return transport is None or transport.is_closing()


def _spent(e: BudgetExhausted) -> str:
    why = str(e).strip()
    return (
        "the budget is spent" + (f" ({why})" if why else "")
        + "; submit your best with `servegym-agent submit`"
    )  # fmt: skip


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def _json_body(request: web.Request) -> dict[str, Any] | web.Response:
    text = await request.text()
    if not text.strip():
        return {}
    try:
        body = json.loads(text)
    except ValueError:
        return _error(400, "the request body must be JSON")
    if not isinstance(body, dict):
        return _error(400, "the request body must be a JSON object")
    return body
