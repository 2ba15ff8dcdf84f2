"""Websockets through the gateway: who opens one, and relaying frames both ways for its life."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from urllib.parse import urlsplit

import websockets
from fastapi import WebSocket, WebSocketDisconnect
from starlette.concurrency import run_in_threadpool

from raypod import errors
from raypod.controlplane import identity
from raypod.server import auth
from raypod.server.gateway.forward import ConcurrencyLimit


async def websocket_caller(websocket: WebSocket) -> identity.Principal | None:
    """Who opens a websocket, or None once it is closed (cross-origin with a cookie, or bad credentials)."""
    if not websocket.headers.get("authorization") and not same_origin(websocket):
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
        await refuse(websocket, exc)
        return None
    return principal


async def refuse(websocket: WebSocket, exc: errors.RaypodError) -> None:
    await websocket.close(code=4401 if isinstance(exc, errors.Unauthenticated) else 4403, reason=exc.message[:120])


async def relay_websocket(
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


def same_origin(websocket: WebSocket) -> bool:
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
