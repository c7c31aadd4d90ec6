"""Serving an aiohttp application on a host and port (0: a free one), for the harness's own
small servers: the control server and key proxy of CLI agents, and the fake provider APIs."""

from __future__ import annotations

from aiohttp import web


async def serve_app(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Start ``app`` on ``host:port``; returns its runner (``cleanup()`` stops it) and the
    port it is bound to."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return runner, int(address[1])
    return runner, port
