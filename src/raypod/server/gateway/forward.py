"""What every gateway route shares: who calls, the request's framing, the per-user in-flight limit, sending
the request upstream and relaying the answer, and sending a browser to a page's own origin."""

from __future__ import annotations

import contextlib
import json
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any
from urllib.parse import quote

import aiohttp
from fastapi import Request
from fastapi.responses import RedirectResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from raypod import errors
from raypod.capabilities.observability import metrics
from raypod.controlplane import identity
from raypod.server import auth
from raypod.server import origins as origins_mod

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
# The only request headers forwarded upstream. Everything else (raypod's credentials and cookies, framing headers,
# X-Forwarded-*/Forwarded from the client, Ray's own x-ray-* headers) stays here; the gateway sets what Ray needs.
FORWARDED_REQUEST_HEADERS = frozenset(
    {
        "accept",
        "accept-encoding",
        "accept-language",
        "cache-control",
        "content-encoding",
        "content-type",
        "if-match",
        "if-modified-since",
        "if-none-match",
        "if-unmodified-since",
        "pragma",
        "range",
        "user-agent",
    }
)
SMALL_BODY_BYTES = 256 * 1024  # answered in one piece; larger bodies stream
# Every method the gateway proxies, each with the right it needs; only methods that need operate rights carry a
# body upstream (a body on a read is refused: it could smuggle a second request onto a pooled connection).
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
METHODS = sorted(READ_METHODS | WRITE_METHODS)


async def caller(request: Request) -> identity.Principal:
    """The caller; a token authenticated a moment ago costs no thread hop and no database read."""
    ids: identity.IdentityService = request.app.state.identities
    token = auth.bearer_token(request.headers.get("authorization"))
    if token is not None:
        cached = ids.cached_principal(token)
        if cached is not None:
            return cached
    return await run_in_threadpool(auth.authenticate, request)


def request_headers(request: Request, length: int | None, added: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """What goes upstream of a request's headers: the forwarded ones, ``added``, and the body's length."""
    headers = [(k, v) for k, v in request.headers.items() if k.lower() in FORWARDED_REQUEST_HEADERS] + added
    if request.method in WRITE_METHODS and length is not None:
        headers.append(("Content-Length", str(length)))
    return headers


def framing(request: Request) -> int | None:
    """The request body's length (None: chunked), after refusing framing that two parsers could read apart.

    Raises:
        BadRequest: both Content-Length and Transfer-Encoding, several or malformed Content-Lengths, or a
        body on a method that reads.
    """
    lengths = request.headers.getlist("content-length")
    chunked = bool(request.headers.getlist("transfer-encoding"))
    if lengths and chunked:
        raise errors.BadRequest("ambiguous request framing: both Content-Length and Transfer-Encoding")
    if len(lengths) > 1 or any(not value.strip().isdigit() for value in lengths):
        raise errors.BadRequest("ambiguous request framing: several or malformed Content-Length headers")
    length = int(lengths[0]) if lengths else None
    if request.method in READ_METHODS and (chunked or (length or 0) > 0):
        raise errors.BadRequest(f"a {request.method} request through the gateway may not carry a body")
    return length


class ConcurrencyLimit:
    """At most ``limit`` requests of one user in flight to one cluster: one caller cannot tie up a dashboard."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._in_flight: dict[tuple[str, str, str], int] = {}

    @contextlib.contextmanager
    def hold(self, user: str, namespace: str, name: str) -> Iterator[None]:
        key = (user, namespace, name)
        if self._in_flight.get(key, 0) >= self.limit:
            raise errors.TooManyRequests(
                f"user '{user}' has {self.limit} requests in flight to cluster {namespace}/{name}; retry shortly"
            )
        self._in_flight[key] = self._in_flight.get(key, 0) + 1
        try:
            yield
        finally:
            self._in_flight[key] -= 1
            if not self._in_flight[key]:
                del self._in_flight[key]


def browser_session(request: Request) -> bool:
    """A browser on its console session (no token): it is sent to the page's own origin, never served here."""
    return "authorization" not in request.headers and auth.session_id(request) is not None


async def enter_origin(
    request: Request,
    target: origins_mod.Target,
    next_path: str,
    may_view: Callable[[identity.Principal], Awaitable[object]],
) -> Response:
    """Redirect a browser session to ``target``'s own origin, with a one-time ticket that lets it in there, once
    ``may_view`` (the route's own check) let the session's user through.

    Raises:
        NotFound (as the gateway answers outsiders), Forbidden (not a read; no origin for these names)."""
    if request.method not in ("GET", "HEAD"):
        raise errors.Forbidden(
            "a browser opens a cluster's or workspace's pages on their own origin (follow the console's link); "
            "this path takes only tools with a token"
        )
    session = auth.session_id(request)
    assert session is not None
    principal = await run_in_threadpool(request.app.state.identities.authenticate_session, session)
    await may_view(principal)
    found: origins_mod.Origins = request.app.state.origins
    base = found.url(target, request.url.scheme, request.url.port)
    if base is None:
        raise errors.Forbidden(
            f"{target.kind} {target.namespace}/{target.name} has no origin of its own (its names are too long, "
            "or its namespace has '--'): open it with a token-based tool"
        )
    ticket = found.issue(target, identity.session_hash(session))
    query = f"?{request.url.query}" if request.url.query else ""
    location = f"{base}{origins_mod.ENTER_PATH}?ticket={ticket}&next={quote(next_path + query, safe='/')}"
    return RedirectResponse(location, status_code=303)


async def forward(
    request: Request,
    url: str,
    headers: list[tuple[str, str]],
    body: Any,
    limit_key: tuple[str, str, str],
    upstream_name: str,
    metric_path: str,
    tls: ssl.SSLContext | None = None,
    own_origin: bool = False,
) -> Response:
    """Send the request upstream and relay its answer: small answers in one piece, others streamed. On the
    console's origin (``own_origin`` False) the answer carries a sandboxing CSP and no cookie; on a cluster's or
    workspace's own origin, cookies only for that host, never one of raypod's (see ``origins``)."""
    limit: ConcurrencyLimit = request.app.state.gateway_limit
    session: aiohttp.ClientSession = request.app.state.gateway_http
    with limit.hold(*limit_key):
        started = time.perf_counter()
        try:
            upstream = await session.request(
                request.method,
                url,
                headers=headers,
                data=body,
                allow_redirects=False,
                auto_decompress=False,
                ssl=tls if tls is not None else True,
            )
        except TimeoutError:
            raise errors.TransientError(f"{upstream_name} did not answer in time") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise errors.TransientError(f"{upstream_name} is not answering ({type(exc).__name__})") from None
        metrics.GATEWAY_SECONDS.labels(metrics.gateway_route(metric_path)).observe(time.perf_counter() - started)
        response_headers = _response_headers(upstream.headers.items(), own_origin)
        if upstream.content_length is not None and upstream.content_length <= SMALL_BODY_BYTES:
            try:
                content = await upstream.read()
            except (TimeoutError, aiohttp.ClientError) as exc:
                raise errors.TransientError(f"{upstream_name} broke off its answer ({type(exc).__name__})") from None
            finally:
                upstream.release()
            answer = Response(content, status_code=upstream.status)
            answer.raw_headers.extend(response_headers)
            return answer
    event_stream = upstream.headers.get("content-type", "").startswith("text/event-stream")
    streamed = StreamingResponse(
        _relay(upstream, event_stream),
        status_code=upstream.status,
        background=BackgroundTask(upstream.release),
    )
    streamed.raw_headers.extend(response_headers)
    return streamed


RAYPOD_COOKIES = ("raypod", "__host-raypod", "__secure-raypod")


def _response_headers(upstream: Any, own_origin: bool) -> list[tuple[bytes, bytes]]:
    """The upstream's answer headers that reach the browser, each Set-Cookie kept apart (JupyterLab sets several).

    No upstream cookie ever reaches the console's cookie jar: on the console's origin none passes; on a proxied
    origin only host-only ones (no Domain, which could reach sibling origins) that are not named like raypod's."""
    kept: list[tuple[bytes, bytes]] = []
    for key, value in upstream:
        lower = key.lower()
        if lower in HOP_BY_HOP or lower == "x-content-type-options":
            continue  # an upstream's own CSP stays: browsers enforce it and ours together
        if lower == "set-cookie":
            name = value.split("=", 1)[0].strip().lower()
            attributes = [part.strip().lower() for part in value.split(";")[1:]]
            if not own_origin or name.startswith(RAYPOD_COOKIES) or any(a.startswith("domain") for a in attributes):
                continue
        kept.append((lower.encode("latin-1"), value.encode("latin-1")))
    policy = origins_mod.ORIGIN_HEADERS if own_origin else origins_mod.CONSOLE_HEADERS
    kept += [(k.encode(), v.encode()) for k, v in policy.items()]
    return kept


async def _relay(upstream: aiohttp.ClientResponse, event_stream: bool = False) -> AsyncIterator[bytes]:
    """The upstream body; an upstream that stalls past the read timeout ends the answer instead of hanging it.

    A server-sent event stream that breaks off (a model replica dying mid-answer) ends with an error event in
    OpenAI's format, which clients raise, rather than looking like a complete answer.
    """
    try:
        async for chunk in upstream.content.iter_any():
            yield chunk
    except (TimeoutError, aiohttp.ClientError) as exc:
        if event_stream:
            error = {
                "message": f"the answer broke off upstream ({type(exc).__name__}); retry the request",
                "type": "server_error",
                "param": None,
                "code": "upstream_failed",
            }
            yield b"data: " + json.dumps({"error": error}).encode() + b"\n\n"
