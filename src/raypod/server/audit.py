"""Every request that may change something (not GET, HEAD or OPTIONS), on the API, the console, the login and the
gateway (``ray job submit`` through ``raypod://``, a job stop), is appended to the audit log with who made it (the
principal authentication left in the request's state), from where, and the status it was answered with."""

from __future__ import annotations

import logging
import re
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from raypod.controlplane import identity

log = logging.getLogger(__name__)

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# A GET that changes something: the provider sends the browser back to it to sign in (the query, which holds the
# authorization code, is never recorded).
SIGN_IN_CALLBACK = "/login/sso/callback"
PRINCIPAL = "principal"  # the key authentication sets in the request's state
TARGET = "audit_target"  # the key a route sets where its path does not name what it changes
# Calls of a cluster's models through the gateway are reads of it (whoever may view it may call them): not changes,
# and far too many (every completion) for the log.
_INFERENCE = re.compile(r"^/clusters/[^/]+/[^/]+/serve/")
_TARGET = re.compile(r"^/(?:api/v1/namespaces/([^/]+)/(?:clusters|spaces)/([^/]+)|(?:clusters|spaces)/([^/]+)/([^/]+))")


def remember(state: Any, principal: identity.Principal) -> identity.Principal:
    """Note who the request is from, for its audit entry; return ``principal``."""
    setattr(state, PRINCIPAL, principal)
    return principal


def name_target(state: Any, target: str) -> None:
    """Name what the request changes (``namespace/name``) where its path does not (a create)."""
    setattr(state, TARGET, target)


def is_inference(scope: Scope) -> bool:
    path: str = scope.get("path", "")
    origin = scope.get("raypod.target")
    if origin is not None:
        return bool(origin.kind == "cluster" and path.startswith("/serve/"))
    return bool(_INFERENCE.match(path))


def describe(scope: Scope) -> tuple[str, str, str]:
    """The request's source (api, login, gateway or console), its action (method and path, no query string: it
    may hold a ticket) and its target (namespace/name where the path names a cluster or a workspace)."""
    path: str = scope.get("path", "")
    origin = scope.get("raypod.target")  # a request to a cluster's or workspace's own origin (the gateway)
    if origin is not None:
        return "gateway", f"{scope.get('method', '')} {path}", f"{origin.namespace}/{origin.name}"
    if path.startswith("/api/"):
        source = "api"
    elif path in ("/login", "/logout") or path.startswith("/login/sso/"):
        source = "login"
    elif path.startswith(("/clusters/", "/spaces/")):
        source = "gateway"
    else:
        source = "console"
    found = _TARGET.match(path)
    target = scope.get("state", {}).get(TARGET) or "/".join(g for g in (found.groups() if found else ()) if g)
    return source, f"{scope.get('method', '')} {path}", target


class AuditTrail:
    """Pure ASGI (a proxied stream passes through untouched): the entry is written once the answer is sent."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (scope.get("method") in SAFE_METHODS and scope.get("path") != SIGN_IN_CALLBACK):
            await self.app(scope, receive, send)
            return
        state: dict[str, Any] = scope.setdefault("state", {})
        status = [500]

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            await self._record(scope, state, status[0])

    async def _record(self, scope: Scope, state: dict[str, Any], result: int) -> None:
        plane = getattr(scope["app"].state, "control_plane", None)
        if plane is None or is_inference(scope):
            return
        principal: identity.Principal | None = state.get(PRINCIPAL)
        source, action, target = describe(scope)
        client = scope.get("client")
        try:
            await run_in_threadpool(
                plane.audit.record,
                actor=principal.user if principal else "",
                token_id=(principal.token_id or "") if principal else "",
                via=("session" if principal.via_session else "token") if principal else "",
                source=source,
                action=action,
                target=target,
                client=client[0] if client else "",
                result=result,
            )
        except Exception:  # the answer is sent: a failed write is logged, never turned into an error for the caller
            log.exception("could not append to the audit log: %s %s", action, result)
