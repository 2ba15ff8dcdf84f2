"""A cluster's or workspace's own origin, ``<name>--<namespace>.<domain>`` (see ``server.origins``): entered with
the console's one-time ticket, then its own cookie; proxied pages never run on the console's origin."""

from __future__ import annotations

from typing import Any

from fastapi import Request, WebSocket
from fastapi.responses import JSONResponse, RedirectResponse, Response
from starlette import routing as starlette_routing
from starlette.concurrency import run_in_threadpool

from raypod import errors
from raypod.controlplane import identity
from raypod.server import audit, auth, limits
from raypod.server import origins as origins_mod
from raypod.server.gateway.clusters import proxy_cluster, resolve
from raypod.server.gateway.forward import (
    METHODS,
    caller,
)
from raypod.server.gateway.sockets import (
    refuse,
    relay_websocket,
    same_origin,
)
from raypod.server.gateway.spaces import proxy_space, resolve_space


def origin_target(connection: Request | WebSocket) -> origins_mod.Target:
    target: origins_mod.Target = connection.scope["raypod.target"]
    return target


async def origin_principal(request: Request, target: origins_mod.Target) -> identity.Principal | None:
    """The caller on an origin: a token, or the origin's own cookie (None: neither, a browser to send through
    the console). A cookie's change must come from a page of this very origin: sibling origins are same-site."""
    if "authorization" in request.headers:
        return await caller(request)
    found: origins_mod.Origins = request.app.state.origins
    value = request.cookies.get(found.cookie_name)
    session = found.session_of(value, target) if value else None
    if session is None:
        return None
    principal: identity.Principal = await run_in_threadpool(
        request.app.state.identities.authenticate_session_hash, session
    )
    audit.remember(request.state, principal)
    if request.method not in auth.SAFE_METHODS:
        auth.check_same_origin(request)
        if request.headers.get("sec-fetch-site") != "same-origin":
            raise errors.Forbidden("a browser's change must come from a page of this origin (Sec-Fetch-Site)")
    return principal


async def origin_enter(request: Request) -> Response:
    """``/_raypod/enter?ticket=...&next=...``: trade the console's one-time ticket for this origin's cookie."""
    target = origin_target(request)
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
    target = origin_target(request)
    principal = await origin_principal(request, target)
    if principal is None:
        if request.method not in ("GET", "HEAD"):
            raise errors.Unauthenticated("no credentials: open this page from raypod's console, or send a token")
        # Back through the console: with a live session it sends the browser here again, with a new ticket.
        rest = request.url.path.lstrip("/") if target.kind == "cluster" else ""
        console = request.app.state.settings.public_url + (target.console_path + rest if rest else target.console_path)
        return RedirectResponse(console, status_code=303)
    if target.kind == "cluster":
        path = request.url.path.lstrip("/")
        return await proxy_cluster(request, principal, target.namespace, target.name, path, own_origin=True)
    if not request.url.path.startswith(target.console_path):
        return RedirectResponse(target.console_path, status_code=307)  # the IDE serves under its base path
    return await proxy_space(request, principal, target.namespace, target.name, own_origin=True)


async def origin_websocket(websocket: WebSocket) -> None:
    target = origin_target(websocket)
    if not websocket.headers.get("authorization") and not same_origin(websocket):
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
            route = await resolve(websocket.app.state, principal, target.namespace, target.name, identity.Verb.VIEW)
            upstream = f"{route.dashboard}{websocket.url.path}"
            headers, what, tls = route.headers, "cluster dashboard", route.tls
        else:
            space = await resolve_space(websocket.app.state, principal, target.namespace, target.name)
            upstream = f"{space.ide}{websocket.url.path}"
            headers, what, tls = {"Authorization": f"token {space.token}"}, f"workspace {target.label}", None
    except errors.RaypodError as exc:
        await refuse(websocket, exc)
        return
    key = (principal.user, target.namespace, target.name if target.kind == "cluster" else f"space/{target.name}")
    await relay_websocket(websocket, upstream, headers, what, tls, limit_key=key)


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
