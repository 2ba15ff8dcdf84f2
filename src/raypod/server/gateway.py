"""The authenticated reverse proxy to each cluster's Ray dashboard: UI, REST, job API, package upload and the
log-tailing websocket, at ``/clusters/<namespace>/<name>/``.

Users authenticate to raypod; the gateway authenticates to Ray with the cluster's own token, which users never
see. Reads need view rights; anything else (submitting or stopping jobs, uploading packages) needs the owner
or a team admin.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp
import websockets
from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import RedirectResponse, Response, StreamingResponse
from starlette import routing as starlette_routing
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from raypod import errors
from raypod import spec as spec_mod
from raypod.capabilities.observability import metrics
from raypod.controlplane import identity, service
from raypod.server import auth

router = APIRouter(tags=["gateway"])
# Added to the app after the API routes (see create_app); matched for every method under /clusters/.


HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
    }
)
# Never forwarded upstream: raypod's own credentials stay with raypod.
PRIVATE_REQUEST_HEADERS = HOP_BY_HOP | {"authorization", "cookie", auth.CSRF_HEADER}
ROUTE_TTL_S = 2.0
SMALL_BODY_BYTES = 256 * 1024  # answered in one piece; larger bodies stream
METHODS = ["GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE"]


@dataclass(frozen=True)
class Route:
    dashboard: str | None
    message: str
    headers: dict[str, str]
    owner: str | None
    team: str | None


class RouteCache:
    """Where each cluster's dashboard is and who owns it, kept for a moment: proxied requests come in bursts."""

    def __init__(self, clusters: service.ClusterService) -> None:
        self.clusters = clusters
        self._routes: dict[tuple[str, str], tuple[float, Route]] = {}

    def cached(self, namespace: str, name: str) -> Route | None:
        entry = self._routes.get((namespace, name))
        return entry[1] if entry and time.monotonic() - entry[0] < ROUTE_TTL_S else None

    def lookup(self, namespace: str, name: str) -> Route:
        """Raises NotFound."""
        cached = self.cached(namespace, name)
        if cached is not None:
            return cached
        view = self.clusters.store.get(namespace, name)
        dashboard = view.status.endpoints.get("dashboard")
        route = Route(
            dashboard=dashboard if dashboard and not view.deleting else None,
            message=view.status.message,
            headers=self.clusters.backend.dashboard_headers(view.uid),
            owner=view.spec.owner,
            team=self.clusters.identities.namespace_team(namespace),
        )
        if route.dashboard:
            self._routes[(namespace, name)] = (time.monotonic(), route)
        return route


def _check_names(namespace: str, name: str) -> None:
    for value, what in ((namespace, "namespace"), (name, "cluster name")):
        if len(value) > 63 or not spec_mod.DNS1123_LABEL.match(value):
            raise errors.NotFound(f"{what} '{value[:80]}' is not a valid name")


async def _resolve(
    request_state: object, principal: identity.Principal, namespace: str, name: str, verb: identity.Verb
) -> Route:
    _check_names(namespace, name)
    cache: RouteCache = request_state.gateway_routes  # type: ignore[attr-defined]
    resolved = cache.cached(namespace, name)
    if resolved is None:
        resolved = await run_in_threadpool(cache.lookup, namespace, name)
    identity.authorize(principal, identity.Verb.VIEW, namespace, resolved.team)
    if verb is not identity.Verb.VIEW:
        identity.authorize(principal, verb, namespace, resolved.team, resolved.owner)
    if resolved.dashboard is None:
        raise errors.Conflict(f"cluster {namespace}/{name} has no running dashboard yet ({resolved.message})")
    return resolved


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


async def proxy(request: Request) -> Response:
    """Forward a request to the cluster's Ray dashboard, streaming both bodies (package uploads are large).

    A plain Starlette route: the gateway is on every dashboard request's path, FastAPI's parameter machinery
    would only add latency.
    """
    params = request.path_params
    namespace, name, path = params["namespace"], params["name"], params["path"]
    principal = await _principal(request)
    verb = identity.Verb.VIEW if request.method in auth.SAFE_METHODS else identity.Verb.OPERATE
    route = await _resolve(request.app.state, principal, namespace, name, verb)
    session: aiohttp.ClientSession = request.app.state.gateway_http
    headers = [(k, v) for k, v in request.headers.items() if k.lower() not in PRIVATE_REQUEST_HEADERS]
    headers.extend(route.headers.items())
    url = f"{route.dashboard}/{path}" + (f"?{request.url.query}" if request.url.query else "")
    started = time.perf_counter()
    try:
        upstream = await session.request(
            request.method,
            url,
            headers=headers,
            data=request.stream() if request.method not in ("GET", "HEAD") else None,
            allow_redirects=False,
            auto_decompress=False,
        )
    except (aiohttp.ClientError, OSError) as exc:
        raise errors.TransientError(
            f"cluster {namespace}/{name} dashboard is not answering ({type(exc).__name__})"
        ) from None
    metrics.GATEWAY_SECONDS.labels(metrics.gateway_route(path)).observe(time.perf_counter() - started)
    response_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP}
    if upstream.content_length is not None and upstream.content_length <= SMALL_BODY_BYTES:
        body = await upstream.read()
        upstream.release()
        return Response(body, status_code=upstream.status, headers=response_headers)
    return StreamingResponse(
        upstream.content.iter_any(),
        status_code=upstream.status,
        headers=response_headers,
        background=BackgroundTask(upstream.release),
    )


@router.websocket("/clusters/{namespace}/{name}/{path:path}")
async def proxy_websocket(websocket: WebSocket, namespace: str, name: str, path: str) -> None:
    """Forward a websocket (``ray job logs --follow`` tails logs through one)."""
    state = websocket.app.state
    if not websocket.headers.get("authorization") and not _same_origin(websocket):
        # Browsers send cookies on cross-site websocket handshakes; only the console's own pages may use them.
        await websocket.close(code=4403, reason="cross-origin websocket refused")
        return
    try:
        principal = await run_in_threadpool(
            auth.authenticate_websocket,
            state.identities,
            websocket.headers.get("authorization"),
            websocket.cookies.get(auth.SESSION_COOKIE),
        )
        route = await _resolve(state, principal, namespace, name, identity.Verb.VIEW)
    except errors.RaypodError as exc:
        await websocket.close(code=4401 if isinstance(exc, errors.Unauthenticated) else 4403, reason=exc.message[:120])
        return
    target = f"{route.dashboard}/{path}".replace("http://", "ws://", 1)
    if websocket.url.query:
        target += f"?{websocket.url.query}"
    try:
        # No permessage-deflate upstream: aiohttp's compressed frames (Ray's dashboard) end a `websockets` session.
        async with websockets.connect(
            target, additional_headers=route.headers, max_size=None, compression=None
        ) as upstream:
            await websocket.accept()
            await _pump(websocket, upstream)
    except (OSError, websockets.InvalidHandshake):
        await websocket.close(code=1011, reason="cluster dashboard is not answering")


def _same_origin(websocket: WebSocket) -> bool:
    origin = websocket.headers.get("origin")
    if origin is None:
        return True  # not a browser: a cookie here was put there on purpose
    return urlsplit(origin).netloc == websocket.headers.get("host")


async def _pump(client: WebSocket, upstream: websockets.ClientConnection) -> None:
    async def downstream() -> None:
        async for message in upstream:
            if isinstance(message, bytes):
                await client.send_bytes(message)
            else:
                await client.send_text(message)
        await client.close()

    async def upstream_side() -> None:
        while True:
            message = await client.receive()
            if message["type"] == "websocket.disconnect":
                await upstream.close()
                return
            if message.get("bytes") is not None:
                await upstream.send(message["bytes"])
            elif message.get("text") is not None:
                await upstream.send(message["text"])

    tasks = [asyncio.create_task(downstream()), asyncio.create_task(upstream_side())]
    _, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


http_route = starlette_routing.Route("/clusters/{namespace}/{name}/{path:path}", proxy, methods=METHODS)
