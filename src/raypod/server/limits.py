"""Limits on what a client may send: a cap on every request body, checked against the declared length first
and against the bytes actually received, so nothing over the cap is read whole into memory."""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from raypod import errors

UPLOAD_SUFFIX = "/working-dirs"
# Bodies bound for a cluster or a workspace (job submissions, package uploads, notebooks saved): the gateway's cap.
PROXIED_PREFIXES = ("/clusters/", "/spaces/")


class BodyLimit:
    def __init__(self, app: ASGIApp, json_limit: int, upload_limit: int, proxied_limit: int) -> None:
        self.app = app
        self.json_limit = json_limit
        self.upload_limit = upload_limit
        self.proxied_limit = proxied_limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "")
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if path.startswith(PROXIED_PREFIXES):
            limit = self.proxied_limit
        else:
            limit = self.upload_limit if path.endswith(UPLOAD_SUFFIX) else self.json_limit
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), b"")
        if declared.isdigit() and int(declared) > limit:
            await _too_large(send, limit)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise errors.PayloadTooLarge(f"request body over the limit of {limit} bytes")
            return message

        await self.app(scope, counted, send)


async def _too_large(send: Send, limit: int) -> None:
    body = json.dumps(
        {
            "code": errors.PayloadTooLarge.code,
            "message": f"request body over the limit of {limit} bytes",
            "detail": None,
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
