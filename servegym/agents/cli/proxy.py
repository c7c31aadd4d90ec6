"""The key-adding reverse proxy: how a CLI agent in its sandbox reaches its model provider
without ever holding the API key.

:class:`KeyProxy` listens on the harness side and forwards every request (method, path,
query, body) to the provider's upstream, streaming the answer back chunk by chunk (so
server-sent events pass through as they come). On the way it removes every credential the
client sent (``Authorization``, ``x-api-key``, ``x-goog-api-key``, ``api-key``, a ``key``
query parameter) and adds the real one, read from the harness environment:

===========  =====================  =====================================  ==================
provider     key variable           header added                           default upstream
===========  =====================  =====================================  ==================
anthropic    ``ANTHROPIC_API_KEY``  ``x-api-key: KEY``                     api.anthropic.com
openai       ``OPENAI_API_KEY``     ``Authorization: Bearer KEY``          api.openai.com
gemini       ``GEMINI_API_KEY``     ``x-goog-api-key: KEY``                generativelanguage
===========  =====================  =====================================  ==================

The sandbox is given the proxy's URL and a placeholder credential for CLIs that insist on
one. With ``client_token`` set, that placeholder is a per-trial secret the proxy checks
(another container on the same Docker network cannot spend the key); without it any
placeholder is accepted. The upstream's path is the API root: requests keep their own path
(``/v1/messages`` goes to ``UPSTREAM/v1/messages``); a trailing ``/v1`` (``/v1beta`` for
Gemini) on a given upstream is dropped, since the clients add it.
"""

from __future__ import annotations

import hmac
from typing import Self
from urllib.parse import urlencode

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from servegym.agents.cli.keys import PLACEHOLDER_KEY, read_api_key
from servegym.agents.cli.usage import CostMeter, UsageReader, billed, request_model
from servegym.aio_serve import serve_app
from servegym.providers.vendors import UPSTREAM, VENDORS, Vendor, normalise_upstream

__all__ = ["KeyProxy", "client_credential", "read_api_key"]

CREDENTIAL_HEADERS = frozenset(
    {"authorization", "x-api-key", "x-goog-api-key", "api-key", "proxy-authorization"}
)
CREDENTIAL_QUERY = frozenset({"key", "api_key", "api-key"})
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)


def client_credential(request: web.Request) -> str | None:
    """The credential a client sent, in whichever of the usual places it put it."""
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    for name in ("x-api-key", "x-goog-api-key", "api-key"):
        if request.headers.get(name):
            return request.headers[name].strip()
    for name in CREDENTIAL_QUERY:
        if request.query.get(name):
            return request.query[name].strip()
    return None


class KeyProxy:
    """A reverse proxy to one provider that adds its key (start it on a running loop)."""

    def __init__(
        self,
        provider: Vendor,
        api_key: str,
        *,
        upstream: str | None = None,
        client_token: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        connect_timeout_s: float = 30.0,
        read_timeout_s: float = 900.0,
        meter: CostMeter | None = None,
    ) -> None:
        if provider not in VENDORS:
            raise ValueError(f"unknown provider {provider!r} (known: {', '.join(VENDORS)})")
        self.provider: Vendor = provider
        self._api_key = api_key
        self.upstream = normalise_upstream(provider, upstream or UPSTREAM[provider])
        self.client_token = client_token
        self.host = host
        self.port = port
        self.requests = 0
        self.refused = 0
        self.meter = meter if meter is not None else CostMeter()
        """Every answered call's tokens and dollars, read off the answers (see
        :mod:`servegym.agents.cli.usage`)."""
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=connect_timeout_s, sock_read=read_timeout_s
        )
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:  # never the key
        return f"KeyProxy({self.provider!r}, upstream={self.upstream!r}, port={self.port})"

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` as bound (once started)."""
        if self._runner is None:
            raise RuntimeError("the proxy is not started")
        return f"http://{self.host}:{self.port}"

    def url_for(self, host: str) -> str:
        """The proxy's URL with another host name (as a container reaches it)."""
        return f"http://{host}:{self.port}"

    @property
    def placeholder(self) -> str:
        """The credential to give the sandbox."""
        return self.client_token or PLACEHOLDER_KEY

    async def start(self) -> Self:
        # No decompression: bytes pass through as they came, with their Content-Encoding.
        self._session = aiohttp.ClientSession(auto_decompress=False, timeout=self._timeout)
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner, self.port = await serve_app(app, self.host, self.port)
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ forwarding

    def upstream_headers(self, request: web.Request) -> CIMultiDict[str]:
        """The request's headers as sent upstream: no hop-by-hop header, no client
        credential, the real one added."""
        headers: CIMultiDict[str] = CIMultiDict()
        for name, value in request.headers.items():
            low = name.lower()
            if low in HOP_BY_HOP or low in CREDENTIAL_HEADERS or low in ("host", "content-length"):
                continue
            headers.add(name, value)
        if "accept-encoding" not in headers:  # else aiohttp would ask for gzip on its behalf
            headers["Accept-Encoding"] = "identity"
        if self.provider == "anthropic":
            headers["x-api-key"] = self._api_key
        elif self.provider == "openai":
            headers["Authorization"] = f"Bearer {self._api_key}"
        else:
            headers["x-goog-api-key"] = self._api_key
        return headers

    def upstream_url(self, request: web.Request) -> str:
        """The upstream URL of the request: its own path and query, less any credential."""
        url = self.upstream + request.rel_url.raw_path
        raw = request.rel_url.raw_query_string
        if any(k.lower() in CREDENTIAL_QUERY for k in request.query):
            raw = urlencode(
                [(k, v) for k, v in request.query.items() if k.lower() not in CREDENTIAL_QUERY]
            )
        return url + (f"?{raw}" if raw else "")

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        if self.client_token is not None:
            given = client_credential(request) or ""
            if not hmac.compare_digest(given.encode(), self.client_token.encode()):
                self.refused += 1
                return _error(401, "the proxy refused the request: wrong sandbox credential")
        assert self._session is not None
        body = await request.read()
        response: web.StreamResponse | None = None
        try:
            async with self._session.request(
                request.method,
                self.upstream_url(request),
                headers=self.upstream_headers(request),
                data=body if body else None,
                allow_redirects=False,
            ) as upstream:
                response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
                for name, value in upstream.headers.items():
                    if name.lower() in HOP_BY_HOP or name.lower() == "content-length":
                        continue
                    response.headers.add(name, value)
                await response.prepare(request)
                reader = UsageReader(self.provider, upstream.headers.get("content-type", ""))
                try:
                    async for chunk in upstream.content.iter_any():  # as it comes: SSE streams
                        reader.feed(chunk)
                        await response.write(chunk)
                    await response.write_eof()
                finally:  # what was answered was spent, even when the stream was cut
                    self._count(request, body, upstream.status, reader)
                return response
        except (aiohttp.ClientError, TimeoutError, ConnectionResetError) as e:
            if response is not None and response.prepared:
                return response  # the answer had started: it ends here, cut
            return _error(502, f"the proxy could not reach {self.upstream}: {type(e).__name__}")

    def _count(self, request: web.Request, body: bytes, status: int, reader: UsageReader) -> None:
        if status >= 400 or not billed(request.path):
            return
        usage = reader.usage()
        if usage is not None:
            self.meter.add(request_model(self.provider, request.path, body), usage)


def _error(status: int, message: str) -> web.Response:
    return web.json_response(
        {"type": "error", "error": {"type": "proxy_error", "message": message}}, status=status
    )
