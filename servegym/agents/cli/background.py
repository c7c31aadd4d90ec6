"""An asyncio event loop on a thread of its own, for the servers a synchronous agent hosts.

:class:`~servegym.agents.cli.agent.CliAgent` runs in the trial's thread and blocks while a
CLI session runs in its container; the key-adding proxy and the control server must answer
meanwhile, so they live on a :class:`BackgroundLoop`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, Self, TypeVar

T = TypeVar("T")


class BackgroundLoop:
    """``start()`` a daemon thread running an event loop; ``run(coro)`` runs a coroutine on
    it from any other thread and returns its result; ``stop()`` ends the loop."""

    def __init__(self, name: str = "servegym-cli-servers") -> None:
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("the background loop is not started")
        return self._loop

    def start(self) -> Self:
        if self._thread is not None:
            return self
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def main() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            loop.run_forever()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=main, name=self.name, daemon=True)
        self._thread.start()
        ready.wait()
        return self

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = 60.0) -> T:
        """Run ``coro`` on the loop and wait for its result (or its exception)."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout_s)

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10.0)
        self._loop = None
        self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
