"""Workspaces through the gateway, at ``/spaces/<namespace>/<name>/``: only their owners (and admins) get in."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import Response
from starlette import routing as starlette_routing
from starlette.concurrency import run_in_threadpool

from raypod import errors
from raypod.controlplane import identity, spaces
from raypod.controlplane.clusters import ClusterService
from raypod.server import origins as origins_mod
from raypod.server.gateway import forward, sockets
from raypod.server.gateway.clusters import check_names

router = APIRouter(tags=["gateway"])


@dataclass(frozen=True)
class SpaceRoute:
    ide: str | None  # where the workspace's IDE answers, None while it does not
    message: str
    token: str
    owner: str | None
    team: str | None
    cluster: str
    suspended: bool


async def resolve_space(
    state: Any, principal: identity.Principal, namespace: str, name: str, *, ready: bool = True
) -> SpaceRoute:
    """Only the workspace's owner and admins get further than a NotFound that names nothing else: a workspace
    runs its owner's code, so even reading its pages needs the owner's rights. Opening the workspace of a cluster
    suspended while idle resumes the cluster when the caller may operate it (as a submitted job does).

    Raises:
        NotFound, Conflict (its IDE is not running).
    """
    check_names(namespace, name)
    clusters: ClusterService = state.clusters
    workspaces: spaces.SpaceService = state.spaces

    def lookup() -> SpaceRoute:
        found = workspaces.upstream(namespace, name)
        view, space = found.view, found.space
        ide = view.status.endpoints.get(f"space/{name}") if space.running and not view.deleting else None
        message = "stopped" if not space.running else f"its IDE is not running yet ({view.status.message})"
        return SpaceRoute(ide, message, found.token, space.owner, found.team, view.spec.name, view.suspended)

    route = await run_in_threadpool(lookup)
    if not spaces.may_open(principal, route.team, route.owner):
        raise errors.NotFound(f"workspace '{name}' not found in namespace '{namespace}'")
    if route.suspended:
        await run_in_threadpool(clusters.resume, principal, namespace, route.cluster)
        message = f"its cluster '{route.cluster}' was suspended while idle and is being resumed; try again shortly"
        route = replace(route, ide=None, message=message)
    if route.ide is None and ready:
        raise errors.Conflict(f"workspace {namespace}/{name} is not ready: {route.message}")
    return route


def space_headers(request: Request, route: SpaceRoute, length: int | None) -> list[tuple[str, str]]:
    return forward.request_headers(request, length, [("Authorization", f"token {route.token}")])


async def space_proxy(request: Request) -> Response:
    """Forward a request to a workspace's IDE, which serves under the same path (its base URL)."""
    params = request.path_params
    namespace, name = params["namespace"], params["name"]
    if forward.browser_session(request):
        target = origins_mod.Target("space", namespace, name)

        async def may_view(principal: identity.Principal) -> object:
            return await resolve_space(request.app.state, principal, namespace, name, ready=False)

        return await forward.enter_origin(request, target, request.url.path, may_view)
    principal = await forward.caller(request)
    return await proxy_space(request, principal, namespace, name, own_origin=False)


async def proxy_space(
    request: Request, principal: identity.Principal, namespace: str, name: str, *, own_origin: bool
) -> Response:
    route = await resolve_space(request.app.state, principal, namespace, name)
    length = forward.framing(request)
    url = f"{route.ide}{request.url.path}" + (f"?{request.url.query}" if request.url.query else "")
    body: Any = request.stream() if request.method in forward.WRITE_METHODS else None
    headers = space_headers(request, route, length)
    return await forward.forward(
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
    principal = await sockets.websocket_caller(websocket)
    if principal is None:
        return
    try:
        route = await resolve_space(websocket.app.state, principal, namespace, name)
    except errors.RaypodError as exc:
        await sockets.refuse(websocket, exc)
        return
    assert route.ide is not None
    headers = {"Authorization": f"token {route.token}"}
    key = (principal.user, namespace, f"space/{name}")
    await sockets.relay_websocket(
        websocket, f"{route.ide}{websocket.url.path}", headers, f"workspace {namespace}/{name}", limit_key=key
    )


space_http_route = starlette_routing.Route(
    "/spaces/{namespace}/{name}/{path:path}", space_proxy, methods=forward.METHODS
)
