"""The authenticated reverse proxy to each cluster's Ray dashboard: UI, REST, job API, package upload and the
log-tailing websocket, at ``/clusters/<namespace>/<name>/``; and its Ray Serve applications under ``serve/``.

Users authenticate to raypod; the gateway authenticates to Ray with the cluster's own token, which users never
see. Reads need view rights; anything else (submitting or stopping jobs, uploading packages) needs the owner
or a team admin.
"""

from __future__ import annotations

import json
import ssl
import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import RedirectResponse, Response
from starlette import routing as starlette_routing
from starlette.concurrency import run_in_threadpool

from raypod import errors
from raypod import spec as spec_mod
from raypod.controlplane import identity
from raypod.controlplane.clusters import ClusterService
from raypod.controlplane.jobs import JobService
from raypod.server import origins as origins_mod
from raypod.server.gateway.forward import (
    METHODS,
    READ_METHODS,
    WRITE_METHODS,
    browser_session,
    caller,
    enter_origin,
    forward,
    framing,
    request_headers,
)
from raypod.server.gateway.sockets import (
    refuse,
    relay_websocket,
    websocket_caller,
)

router = APIRouter(tags=["gateway"])
MAX_SUBMISSION_BYTES = 1024 * 1024  # a Ray job submission's JSON (the package goes up separately)
ROUTE_TTL_S = 2.0  # how long a cluster's route is kept (proxied requests come in bursts)
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

    def __init__(self, clusters: ClusterService) -> None:
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
        upstream = self.clusters.upstream(namespace, name)
        view = upstream.view
        dashboard = view.status.endpoints.get("dashboard")
        route = Route(
            dashboard=dashboard if dashboard and not view.deleting else None,
            message=view.status.message,
            headers=upstream.headers,
            owner=view.spec.owner,
            team=upstream.team,
            serve=view.status.endpoints.get("serve") if not view.deleting else None,
            serve_apps=upstream.serve_apps,
            tls=upstream.tls,
        )
        if route.dashboard:
            self._routes[(namespace, name)] = (time.monotonic(), route)
        return route


def check_names(namespace: str, name: str) -> None:
    for value, what in ((namespace, "namespace"), (name, "cluster name")):
        if not spec_mod.is_dns_label(value):
            raise errors.NotFound(f"{what} '{value[:80]}' is not a valid name")


async def resolve(
    request_state: object, principal: identity.Principal, namespace: str, name: str, verb: identity.Verb
) -> Route:
    """The gateway's one question for a request: may ``principal`` ``verb`` this cluster? A caller who may not
    view the namespace gets exactly the answer of a cluster that does not exist, and no names; the store is not
    asked about its clusters for such a caller (the first check, only where the route is not cached).

    Raises:
        NotFound, Forbidden (may view but not operate), Conflict (no dashboard yet).
    """
    check_names(namespace, name)
    missing = not_found(namespace, name)
    cache: RouteCache = request_state.gateway_routes  # type: ignore[attr-defined]
    route = cache.cached(namespace, name)
    if route is None:
        ids: identity.IdentityService = request_state.identities  # type: ignore[attr-defined]
        team = await run_in_threadpool(ids.namespace_team, namespace)
        identity.authorize_hidden(principal, identity.Verb.VIEW, namespace, team, None, missing)
        try:
            route = await run_in_threadpool(cache.lookup, namespace, name)
        except errors.NotFound:
            raise errors.NotFound(missing) from None
    identity.authorize_hidden(principal, verb, namespace, route.team, route.owner, missing)
    if route.dashboard is None:
        raise errors.Conflict(f"cluster {namespace}/{name} has no running dashboard yet ({route.message})")
    return route


def not_found(namespace: str, name: str) -> str:
    return f"cluster '{name}' not found in namespace '{namespace}'"


@router.api_route("/clusters/{namespace}/{name}", methods=METHODS, include_in_schema=False)
async def cluster_root(request: Request, namespace: str, name: str) -> RedirectResponse:
    principal = await caller(request)
    await resolve(request.app.state, principal, namespace, name, identity.Verb.VIEW)
    return RedirectResponse(f"/clusters/{namespace}/{name}/", status_code=307)


def upstream_headers(request: Request, route: Route, prefix: str, length: int | None) -> list[tuple[str, str]]:
    client = request.client.host if request.client else ""
    forwarded = [
        ("X-Forwarded-For", client),
        ("X-Forwarded-Proto", request.url.scheme),
        ("X-Forwarded-Host", request.headers.get("host", "")),
        ("X-Forwarded-Prefix", prefix),
    ]
    return [*request_headers(request, length, forwarded), *route.headers.items()]


async def proxy(request: Request) -> Response:
    """Forward a request to the cluster's Ray dashboard, streaming both bodies (package uploads are large).

    A plain Starlette route: the gateway is on every dashboard request's path, FastAPI's parameter machinery
    would only add latency.
    """
    params = request.path_params
    namespace, name, path = params["namespace"], params["name"], params["path"]
    if browser_session(request):
        target = origins_mod.Target("cluster", namespace, name)

        async def may_view(principal: identity.Principal) -> object:
            return await resolve(request.app.state, principal, namespace, name, identity.Verb.VIEW)

        return await enter_origin(request, target, "/" + path, may_view)
    principal = await caller(request)
    return await proxy_cluster(request, principal, namespace, name, path, own_origin=False)


async def proxy_cluster(
    request: Request, principal: identity.Principal, namespace: str, name: str, path: str, *, own_origin: bool
) -> Response:
    serving = path.startswith(SERVE_PREFIX)
    # Inference is a read of the cluster: whoever may view it may call its models; changing it needs operate.
    verb = identity.Verb.VIEW if request.method in READ_METHODS or serving else identity.Verb.OPERATE
    route = await resolve(request.app.state, principal, namespace, name, verb)
    length = framing(request)
    prefix = "" if own_origin else f"/clusters/{namespace}/{name}"
    headers = upstream_headers(request, route, prefix, length)
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
        body = await checked_submission(request, principal.user, namespace, name)
        length = len(body)
        headers = upstream_headers(request, route, prefix, length)
    return await forward(
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


async def checked_submission(request: Request, submitter: str, namespace: str, cluster: str) -> bytes:
    """A plain ``ray job submit`` body, read whole (it is small), with its raypod.hang_* metadata validated: a
    bad hang rule is refused here, before Ray starts a job that would silently run without it. The submitter is
    written into its metadata (``raypod.submitted_by``, whatever the body said) and signed, for raypod's job list
    (controlplane/jobs/attribution.py).

    Raises:
        PayloadTooLarge: over MAX_SUBMISSION_BYTES. InvalidSpec: a bad raypod.hang_* value.
    """
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_SUBMISSION_BYTES:
            raise errors.PayloadTooLarge(f"a job submission is limited to {MAX_SUBMISSION_BYTES // 1024} KiB")
    try:
        submission = json.loads(body or b"{}")
        metadata = submission.get("metadata") or {}
    except (ValueError, AttributeError):
        return body  # not ours to judge: Ray answers a malformed submission itself
    if not isinstance(metadata, dict):
        return body
    try:
        spec_mod.hang_overrides_from_metadata({str(k): str(v) for k, v in metadata.items()})
    except ValueError as exc:
        raise errors.InvalidSpec(str(exc)) from None
    jobs: JobService = request.app.state.jobs
    return json.dumps(jobs.attribution.sign(namespace, cluster, submission, submitter)).encode()


@router.websocket("/clusters/{namespace}/{name}/{path:path}")
async def proxy_websocket(websocket: WebSocket, namespace: str, name: str, path: str) -> None:
    """Forward a websocket (``ray job logs --follow`` tails logs through one)."""
    principal = await websocket_caller(websocket)
    if principal is None:
        return
    try:
        route = await resolve(websocket.app.state, principal, namespace, name, identity.Verb.VIEW)
    except errors.RaypodError as exc:
        await refuse(websocket, exc)
        return
    key = (principal.user, namespace, name)
    await relay_websocket(
        websocket, f"{route.dashboard}/{path}", route.headers, "cluster dashboard", route.tls, limit_key=key
    )


http_route = starlette_routing.Route("/clusters/{namespace}/{name}/{path:path}", proxy, methods=METHODS)
