"""The authenticated reverse proxy to each cluster's Ray dashboard: UI, REST, job API, package upload and the
log-tailing websocket, at ``/clusters/<namespace>/<name>/``.

Users authenticate to raypod; the gateway authenticates to Ray with the cluster's own token, which users never
see. Reads need view rights; anything else (submitting or stopping jobs, uploading packages) needs the owner
or a team admin.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

import aiohttp
import websockets
from fastapi import APIRouter, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette import routing as starlette_routing
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from raypod import errors, state
from raypod import spec as spec_mod
from raypod.backends import base
from raypod.capabilities.observability import metrics
from raypod.controlplane import identity, service, spaces
from raypod.server import auth, limits
from raypod.server import origins as origins_mod

router = APIRouter(tags=["gateway"])
# Added to the app after the API routes (see create_app); matched for every method under /clusters/.


MAX_SUBMISSION_BYTES = 1024 * 1024  # a Ray job submission's JSON (the package goes up separately)
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
ROUTE_TTL_S = 2.0
SMALL_BODY_BYTES = 256 * 1024  # answered in one piece; larger bodies stream
# Every method the gateway proxies, each with the right it needs; only methods that need operate rights carry a
# body upstream (a body on a read is refused: it could smuggle a second request onto a pooled connection).
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
METHODS = sorted(READ_METHODS | WRITE_METHODS)


SERVE_PREFIX = "serve/"  # /clusters/<ns>/<name>/serve/<app>/...: the cluster's Ray Serve HTTP proxy


@dataclass(frozen=True)
class Route:
    dashboard: str | None
    message: str
    headers: dict[str, str]
    owner: str | None
    team: str | None
    serve: str | None = None
    serve_apps: dict[str, str] = field(default_factory=dict)  # app -> its own Serve proxy (a RayService's)
    tls: ssl.SSLContext | None = None  # how https upstreams are verified; None: the system's CAs


class RouteCache:
    """Where each cluster's dashboard is and who owns it, kept for a moment: proxied requests come in bursts."""

    def __init__(self, clusters: service.ClusterService) -> None:
        self.clusters = clusters
        self._routes: dict[tuple[str, str], tuple[float, Route]] = {}

    def cached(self, namespace: str, name: str) -> Route | None:
        entry = self._routes.get((namespace, name))
        return entry[1] if entry and time.monotonic() - entry[0] < ROUTE_TTL_S else None

    def lookup(self, namespace: str, name: str) -> Route:
        """Raises NotFound (naming no other cluster)."""
        cached = self.cached(namespace, name)
        if cached is not None:
            return cached
        view = self.clusters.store.get(namespace, name, list_known=False)
        dashboard = view.status.endpoints.get("dashboard")
        route = Route(
            dashboard=dashboard if dashboard and not view.deleting else None,
            message=view.status.message,
            headers=self.clusters.backend.dashboard_headers(view.uid),
            owner=view.spec.owner,
            team=self.clusters.identities.namespace_team(namespace),
            serve=view.status.endpoints.get("serve") if not view.deleting else None,
            serve_apps=_serve_apps(self.clusters.backend, view),
            tls=self.clusters.backend.upstream_tls(view.uid),
        )
        if route.dashboard:
            self._routes[(namespace, name)] = (time.monotonic(), route)
        return route


def _serve_apps(backend: object, view: state.ClusterView) -> dict[str, str]:
    if view.deleting or not isinstance(backend, base.ServiceRunner):
        return {}
    return backend.serve_endpoints(view.uid)


def _check_names(namespace: str, name: str) -> None:
    for value, what in ((namespace, "namespace"), (name, "cluster name")):
        if len(value) > 63 or not spec_mod.DNS1123_LABEL.match(value):
            raise errors.NotFound(f"{what} '{value[:80]}' is not a valid name")


async def _resolve(
    request_state: object, principal: identity.Principal, namespace: str, name: str, verb: identity.Verb
) -> Route:
    """Authorize, then look up: a caller who may not view the namespace gets exactly the answer of a cluster
    that does not exist there, and no names.

    Raises:
        NotFound, Forbidden (may view but not operate), Conflict (no dashboard yet).
    """
    _check_names(namespace, name)
    cache: RouteCache = request_state.gateway_routes  # type: ignore[attr-defined]
    resolved = cache.cached(namespace, name)
    if resolved is None:
        ids: identity.IdentityService = request_state.identities  # type: ignore[attr-defined]
        team = await run_in_threadpool(ids.namespace_team, namespace)
        try:
            identity.authorize(principal, identity.Verb.VIEW, namespace, team)
        except errors.Forbidden:
            raise errors.NotFound(_not_found(namespace, name)) from None
        try:
            resolved = await run_in_threadpool(cache.lookup, namespace, name)
        except errors.NotFound:
            raise errors.NotFound(_not_found(namespace, name)) from None
    try:
        identity.authorize(principal, identity.Verb.VIEW, namespace, resolved.team)
    except errors.Forbidden:
        raise errors.NotFound(_not_found(namespace, name)) from None
    if verb is not identity.Verb.VIEW:
        identity.authorize(principal, verb, namespace, resolved.team, resolved.owner)
    if resolved.dashboard is None:
        raise errors.Conflict(f"cluster {namespace}/{name} has no running dashboard yet ({resolved.message})")
    return resolved


def _not_found(namespace: str, name: str) -> str:
    return f"cluster '{name}' not found in namespace '{namespace}'"


async def _principal(request: Request) -> identity.Principal:
    """The caller; a token authenticated a moment ago costs no thread hop and no database read."""
    ids: identity.IdentityService = request.app.state.identities
    token = auth.bearer_token(request.headers.get("authorization"))
    if token is not None:
        cached = ids.cached_principal(token)
        if cached is not None:
            return cached
    return await run_in_threadpool(auth.authenticate, request)


@router.api_route("/clusters/{namespace}/{name}", methods=METHODS, include_in_schema=False)
async def cluster_root(request: Request, namespace: str, name: str) -> RedirectResponse:
    principal = await _principal(request)
    await _resolve(request.app.state, principal, namespace, name, identity.Verb.VIEW)
    return RedirectResponse(f"/clusters/{namespace}/{name}/", status_code=307)


def _framing(request: Request) -> int | None:
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


def _upstream_headers(request: Request, route: Route, prefix: str, length: int | None) -> list[tuple[str, str]]:
    headers = [(k, v) for k, v in request.headers.items() if k.lower() in FORWARDED_REQUEST_HEADERS]
    client = request.client.host if request.client else ""
    headers += [
        ("X-Forwarded-For", client),
        ("X-Forwarded-Proto", request.url.scheme),
        ("X-Forwarded-Host", request.headers.get("host", "")),
        ("X-Forwarded-Prefix", prefix),
    ]
    if request.method in WRITE_METHODS and length is not None:
        headers.append(("Content-Length", str(length)))
    headers.extend(route.headers.items())
    return headers


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


async def proxy(request: Request) -> Response:
    """Forward a request to the cluster's Ray dashboard, streaming both bodies (package uploads are large).

    A plain Starlette route: the gateway is on every dashboard request's path, FastAPI's parameter machinery
    would only add latency.
    """
    params = request.path_params
    namespace, name, path = params["namespace"], params["name"], params["path"]
    if _browser_session(request):
        return await _enter_origin(request, origins_mod.Target("cluster", namespace, name), "/" + path)
    principal = await _principal(request)
    return await _proxy_cluster(request, principal, namespace, name, path, own_origin=False)


async def _proxy_cluster(
    request: Request, principal: identity.Principal, namespace: str, name: str, path: str, *, own_origin: bool
) -> Response:
    serving = path.startswith(SERVE_PREFIX)
    # Inference is a read of the cluster: whoever may view it may call its models; changing it needs operate.
    verb = identity.Verb.VIEW if request.method in READ_METHODS or serving else identity.Verb.OPERATE
    route = await _resolve(request.app.state, principal, namespace, name, verb)
    length = _framing(request)
    prefix = "" if own_origin else f"/clusters/{namespace}/{name}"
    headers = _upstream_headers(request, route, prefix, length)
    upstream_base, upstream_path = route.dashboard, path
    if serving:
        upstream_path = path[len(SERVE_PREFIX) :]
        serve = route.serve_apps.get(upstream_path.split("/", 1)[0]) or route.serve
        if serve is None:
            raise errors.Conflict(f"cluster {namespace}/{name} has no Serve endpoint")
        upstream_base = serve
        headers = [(k, v) for k, v in headers if k not in route.headers]  # the Ray token stays off Serve's path
    upstream_name = "Serve" if serving else "dashboard"
    url = f"{upstream_base}/{upstream_path}" + (f"?{request.url.query}" if request.url.query else "")
    body: Any = request.stream() if request.method in WRITE_METHODS else None
    if request.method == "POST" and path.strip("/") == "api/jobs":
        body = await _checked_submission(request)
        length = len(body)
        headers = _upstream_headers(request, route, prefix, length)
    return await _forward(
        request,
        url,
        headers,
        body,
        (principal.user, namespace, name),
        f"cluster {namespace}/{name} {upstream_name}",
        path,
        route.tls,
        own_origin,
    )


def _browser_session(request: Request) -> bool:
    """A browser on its console session (no token): it is sent to the page's own origin, never served here."""
    return "authorization" not in request.headers and auth.session_id(request) is not None


async def _enter_origin(request: Request, target: origins_mod.Target, next_path: str) -> Response:
    """Redirect a browser session to ``target``'s own origin, with a one-time ticket that lets it in there.

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
    if target.kind == "cluster":
        await _resolve(request.app.state, principal, target.namespace, target.name, identity.Verb.VIEW)
    else:
        await _resolve_space(request.app.state, principal, target.namespace, target.name, ready=False)
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


async def _forward(
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


async def _checked_submission(request: Request) -> bytes:
    """A plain ``ray job submit`` body, read whole (it is small), with its raypod.hang_* metadata validated: a
    bad hang rule is refused here, before Ray starts a job that would silently run without it.

    Raises:
        PayloadTooLarge: over MAX_SUBMISSION_BYTES. InvalidSpec: a bad raypod.hang_* value.
    """
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_SUBMISSION_BYTES:
            raise errors.PayloadTooLarge(f"a job submission is limited to {MAX_SUBMISSION_BYTES // 1024} KiB")
    try:
        metadata = json.loads(body or b"{}").get("metadata") or {}
    except (ValueError, AttributeError):
        return body  # not ours to judge: Ray answers a malformed submission itself
    if isinstance(metadata, dict):
        try:
            spec_mod.hang_overrides_from_metadata({str(k): str(v) for k, v in metadata.items()})
        except ValueError as exc:
            raise errors.InvalidSpec(str(exc)) from None
    return body


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


@router.websocket("/clusters/{namespace}/{name}/{path:path}")
async def proxy_websocket(websocket: WebSocket, namespace: str, name: str, path: str) -> None:
    """Forward a websocket (``ray job logs --follow`` tails logs through one)."""
    principal = await _websocket_caller(websocket)
    if principal is None:
        return
    try:
        route = await _resolve(websocket.app.state, principal, namespace, name, identity.Verb.VIEW)
    except errors.RaypodError as exc:
        await _refuse(websocket, exc)
        return
    key = (principal.user, namespace, name)
    await _relay_websocket(
        websocket, f"{route.dashboard}/{path}", route.headers, "cluster dashboard", route.tls, limit_key=key
    )


async def _websocket_caller(websocket: WebSocket) -> identity.Principal | None:
    """Who opens a websocket, or None once it is closed (cross-origin with a cookie, or bad credentials)."""
    if not websocket.headers.get("authorization") and not _same_origin(websocket):
        # Browsers send cookies on cross-site websocket handshakes; only this server's own pages may use them.
        await websocket.close(code=4403, reason="cross-origin websocket refused")
        return None
    try:
        principal: identity.Principal = await run_in_threadpool(
            auth.authenticate_websocket,
            websocket.app.state.identities,
            websocket.headers.get("authorization"),
            auth.session_id(websocket),
        )
    except errors.RaypodError as exc:
        await _refuse(websocket, exc)
        return None
    return principal


async def _refuse(websocket: WebSocket, exc: errors.RaypodError) -> None:
    await websocket.close(code=4401 if isinstance(exc, errors.Unauthenticated) else 4403, reason=exc.message[:120])


async def _relay_websocket(
    websocket: WebSocket,
    upstream_url: str,
    headers: dict[str, str],
    what: str,
    tls: ssl.SSLContext | None = None,
    *,
    limit_key: tuple[str, str, str],
) -> None:
    """Relay a websocket for its life, counted in its user's in-flight limit to that cluster (a held websocket
    ties up the upstream as a request does)."""
    limit: ConcurrencyLimit = websocket.app.state.gateway_limit
    try:
        with limit.hold(*limit_key):
            await _relay_websocket_held(websocket, upstream_url, headers, what, tls)
    except errors.TooManyRequests as exc:
        await websocket.close(code=4429, reason=exc.message[:120])


async def _relay_websocket_held(
    websocket: WebSocket, upstream_url: str, headers: dict[str, str], what: str, tls: ssl.SSLContext | None
) -> None:
    secure = upstream_url.startswith("https://")
    target = "wss://" + upstream_url[8:] if secure else upstream_url.replace("http://", "ws://", 1)
    if websocket.url.query:
        target += f"?{websocket.url.query}"
    settings = websocket.app.state.settings
    subprotocols = [p.strip() for p in websocket.headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
    try:
        # No permessage-deflate upstream: aiohttp's compressed frames (Ray's dashboard) end a `websockets` session.
        # Pings keep the path open, but a late pong on a busy host never closes a log stream.
        async with websockets.connect(
            target,
            additional_headers=headers,
            subprotocols=subprotocols or None,  # type: ignore[arg-type]
            max_size=None,
            compression=None,
            ping_interval=settings.ws_ping_interval_s,
            ping_timeout=None,
            # The handshake's answer is a read, and may wait: JupyterLab upgrades a kernel's channels only once the
            # kernel has started, which on a busy host takes more than a connect timeout.
            open_timeout=settings.gateway_read_timeout_s,
            ssl=tls if secure else None,  # wss without a context: the system's CAs
        ) as upstream:
            await websocket.accept(subprotocol=upstream.subprotocol)
            await _pump(websocket, upstream)
    except (OSError, websockets.InvalidHandshake):
        await websocket.close(code=1011, reason=f"{what} is not answering")


def _same_origin(websocket: WebSocket) -> bool:
    origin = websocket.headers.get("origin")
    if origin is None:
        return True  # not a browser: a cookie here was put there on purpose
    return urlsplit(origin).netloc == websocket.headers.get("host")


async def _pump(client: WebSocket, upstream: websockets.ClientConnection) -> None:
    """Relay frames both ways until one side closes; the other side is then closed with the same code."""

    async def downstream() -> None:
        try:
            async for message in upstream:
                if isinstance(message, bytes):
                    await client.send_bytes(message)
                else:
                    await client.send_text(message)
        except websockets.ConnectionClosed:
            pass
        except WebSocketDisconnect:  # the client left while a frame was on its way: the other side closes upstream
            return
        code = upstream.close_code if upstream.close_code is not None else 1000
        with contextlib.suppress(Exception):
            await client.close(code=code if code != 1005 else 1000, reason=(upstream.close_reason or "")[:120])

    async def upstream_side() -> None:
        while True:
            message = await client.receive()
            if message["type"] == "websocket.disconnect":
                code = int(message.get("code") or 1000)
                with contextlib.suppress(Exception):
                    await upstream.close(code=code if 1000 <= code < 5000 and code not in (1005, 1006) else 1000)
                return
            if message.get("bytes") is not None:
                await upstream.send(message["bytes"])
            elif message.get("text") is not None:
                await upstream.send(message["text"])

    tasks = [asyncio.create_task(downstream()), asyncio.create_task(upstream_side())]
    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in tasks:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task  # a finished task's exception is retrieved here too: either side may end the relay


http_route = starlette_routing.Route("/clusters/{namespace}/{name}/{path:path}", proxy, methods=METHODS)


# -- workspaces: /spaces/<namespace>/<name>/ ---------------------------------------------------------------------


@dataclass(frozen=True)
class SpaceRoute:
    ide: str | None  # where the workspace's IDE answers, None while it does not
    message: str
    token: str
    owner: str | None
    team: str | None


async def _resolve_space(
    state: Any, principal: identity.Principal, namespace: str, name: str, *, ready: bool = True
) -> SpaceRoute:
    """Only the workspace's owner and admins get further than a NotFound that names nothing else: a workspace
    runs its owner's code, so even reading its pages needs the owner's rights.

    Raises:
        NotFound, Conflict (its IDE is not running).
    """
    _check_names(namespace, name)
    clusters: service.ClusterService = state.clusters

    def lookup() -> SpaceRoute:
        view = next((v for v in clusters.store.list(namespace) if v.spec.space(name)), None)
        space = view.spec.space(name) if view else None
        if view is None or space is None:
            raise errors.NotFound(f"workspace '{name}' not found in namespace '{namespace}'")
        ide = view.status.endpoints.get(f"space/{name}") if space.running and not view.deleting else None
        message = "stopped" if not space.running else f"its IDE is not running yet ({view.status.message})"
        token = clusters.backend.sidecar_token(view.uid, space.node_name(), spec_mod.IDE_SIDECAR)
        return SpaceRoute(ide, message, token, space.owner, clusters.identities.namespace_team(namespace))

    route = await run_in_threadpool(lookup)
    if not spaces.may_open(principal, route.team, route.owner):
        raise errors.NotFound(f"workspace '{name}' not found in namespace '{namespace}'")
    if route.ide is None and ready:
        raise errors.Conflict(f"workspace {namespace}/{name} is not ready: {route.message}")
    return route


def _space_headers(request: Request, route: SpaceRoute, length: int | None) -> list[tuple[str, str]]:
    headers = [(k, v) for k, v in request.headers.items() if k.lower() in FORWARDED_REQUEST_HEADERS]
    headers.append(("Authorization", f"token {route.token}"))
    if request.method in WRITE_METHODS and length is not None:
        headers.append(("Content-Length", str(length)))
    return headers


async def space_proxy(request: Request) -> Response:
    """Forward a request to a workspace's IDE, which serves under the same path (its base URL)."""
    params = request.path_params
    namespace, name = params["namespace"], params["name"]
    if _browser_session(request):
        return await _enter_origin(request, origins_mod.Target("space", namespace, name), request.url.path)
    principal = await _principal(request)
    return await _proxy_space(request, principal, namespace, name, own_origin=False)


async def _proxy_space(
    request: Request, principal: identity.Principal, namespace: str, name: str, *, own_origin: bool
) -> Response:
    route = await _resolve_space(request.app.state, principal, namespace, name)
    length = _framing(request)
    url = f"{route.ide}{request.url.path}" + (f"?{request.url.query}" if request.url.query else "")
    body: Any = request.stream() if request.method in WRITE_METHODS else None
    headers = _space_headers(request, route, length)
    return await _forward(
        request,
        url,
        headers,
        body,
        (principal.user, namespace, f"space/{name}"),
        f"workspace {namespace}/{name}",
        "space",
        own_origin=own_origin,
    )


@router.websocket("/spaces/{namespace}/{name}/{path:path}")
async def space_websocket(websocket: WebSocket, namespace: str, name: str, path: str) -> None:
    """A workspace's websockets: kernels, terminals."""
    principal = await _websocket_caller(websocket)
    if principal is None:
        return
    try:
        route = await _resolve_space(websocket.app.state, principal, namespace, name)
    except errors.RaypodError as exc:
        await _refuse(websocket, exc)
        return
    assert route.ide is not None
    headers = {"Authorization": f"token {route.token}"}
    key = (principal.user, namespace, f"space/{name}")
    await _relay_websocket(
        websocket, f"{route.ide}{websocket.url.path}", headers, f"workspace {namespace}/{name}", limit_key=key
    )


space_http_route = starlette_routing.Route("/spaces/{namespace}/{name}/{path:path}", space_proxy, methods=METHODS)


# -- a cluster's or workspace's own origin: <name>--<namespace>.<domain> (see origins) ----------------------------


def _target(connection: Request | WebSocket) -> origins_mod.Target:
    target: origins_mod.Target = connection.scope["raypod.target"]
    return target


async def _origin_principal(request: Request, target: origins_mod.Target) -> identity.Principal | None:
    """The caller on an origin: a token, or the origin's own cookie (None: neither, a browser to send through
    the console). A cookie's change must come from a page of this very origin: sibling origins are same-site."""
    if "authorization" in request.headers:
        return await _principal(request)
    found: origins_mod.Origins = request.app.state.origins
    value = request.cookies.get(found.cookie_name)
    session = found.session_of(value, target) if value else None
    if session is None:
        return None
    principal: identity.Principal = await run_in_threadpool(
        request.app.state.identities.authenticate_session_hash, session
    )
    if request.method not in auth.SAFE_METHODS:
        auth.check_same_origin(request)
        if request.headers.get("sec-fetch-site") != "same-origin":
            raise errors.Forbidden("a browser's change must come from a page of this origin (Sec-Fetch-Site)")
    return principal


async def origin_enter(request: Request) -> Response:
    """``/_raypod/enter?ticket=...&next=...``: trade the console's one-time ticket for this origin's cookie."""
    target = _target(request)
    found: origins_mod.Origins = request.app.state.origins
    session = found.redeem(request.query_params.get("ticket", ""), target)
    if session is None:
        raise errors.Forbidden("this link has expired or was already used: open the page again from the console")
    response = RedirectResponse(auth.same_origin_path(request.query_params.get("next", "/")), status_code=303)
    response.set_cookie(
        found.cookie_name,
        found.cookie(target, session),
        max_age=origins_mod.COOKIE_TTL_S,
        httponly=True,
        secure=found.secure,
        samesite="lax",  # the console's link is a top-level navigation from another site
        path="/",
    )
    return response


async def origin_proxy(request: Request) -> Response:
    target = _target(request)
    principal = await _origin_principal(request, target)
    if principal is None:
        if request.method not in ("GET", "HEAD"):
            raise errors.Unauthenticated("no credentials: open this page from raypod's console, or send a token")
        # Back through the console: with a live session it sends the browser here again, with a new ticket.
        rest = request.url.path.lstrip("/") if target.kind == "cluster" else ""
        console = request.app.state.settings.public_url + (target.console_path + rest if rest else target.console_path)
        return RedirectResponse(console, status_code=303)
    if target.kind == "cluster":
        path = request.url.path.lstrip("/")
        return await _proxy_cluster(request, principal, target.namespace, target.name, path, own_origin=True)
    if not request.url.path.startswith(target.console_path):
        return RedirectResponse(target.console_path, status_code=307)  # the IDE serves under its base path
    return await _proxy_space(request, principal, target.namespace, target.name, own_origin=True)


async def origin_websocket(websocket: WebSocket) -> None:
    target = _target(websocket)
    if not websocket.headers.get("authorization") and not _same_origin(websocket):
        await websocket.close(code=4403, reason="cross-origin websocket refused")
        return
    found: origins_mod.Origins = websocket.app.state.origins
    value = websocket.cookies.get(found.cookie_name)
    session = found.session_of(value, target) if value else None
    try:
        if websocket.headers.get("authorization") or session is None:
            principal = await run_in_threadpool(
                auth.authenticate_websocket,
                websocket.app.state.identities,
                websocket.headers.get("authorization"),
                None,
            )
        else:
            principal = await run_in_threadpool(websocket.app.state.identities.authenticate_session_hash, session)
        if target.kind == "cluster":
            route = await _resolve(websocket.app.state, principal, target.namespace, target.name, identity.Verb.VIEW)
            upstream = f"{route.dashboard}{websocket.url.path}"
            headers, what, tls = route.headers, "cluster dashboard", route.tls
        else:
            space = await _resolve_space(websocket.app.state, principal, target.namespace, target.name)
            upstream = f"{space.ide}{websocket.url.path}"
            headers, what, tls = {"Authorization": f"token {space.token}"}, f"workspace {target.label}", None
    except errors.RaypodError as exc:
        await _refuse(websocket, exc)
        return
    key = (principal.user, target.namespace, target.name if target.kind == "cluster" else f"space/{target.name}")
    await _relay_websocket(websocket, upstream, headers, what, tls, limit_key=key)


def _answer_errors(handler: Any) -> Any:
    """The origin router is outside the API's exception handlers: it answers raypod's errors the same way."""

    async def answered(request: Request) -> Response:
        try:
            result: Response = await handler(request)
            return result
        except errors.RaypodError as exc:
            return JSONResponse(exc.to_dict(), status_code=exc.http_status, headers=origins_mod.ORIGIN_HEADERS)

    return answered


origin_router = starlette_routing.Router(
    routes=[
        starlette_routing.Route(origins_mod.ENTER_PATH, _answer_errors(origin_enter), methods=["GET"]),
        starlette_routing.Route("/{path:path}", _answer_errors(origin_proxy), methods=METHODS),
        starlette_routing.WebSocketRoute("/{path:path}", origin_websocket),
    ]
)


class OriginDispatch:
    """Sends every request whose Host is a cluster's or workspace's own origin to ``origin_router`` (with the
    proxied-body cap); everything else to the console and API."""

    def __init__(self, app: Any, proxied_limit: int) -> None:
        self.app = app
        self.origin_app = limits.BodyLimit(origin_router, proxied_limit, proxied_limit, proxied_limit)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            host = next((v for k, v in scope["headers"] if k == b"host"), b"").decode("latin-1")
            found: origins_mod.Origins | None = getattr(scope["app"].state, "origins", None)
            target = found.target_of(host) if found is not None and host else None
            if target is not None:
                scope["raypod.target"] = target
                await self.origin_app(scope, receive, send)
                return
        await self.app(scope, receive, send)
