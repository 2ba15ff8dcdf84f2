"""Who is calling: a bearer token, or a browser session cookie plus a CSRF header for unsafe methods."""

from __future__ import annotations

import hmac
import threading
import time
from typing import Annotated

from fastapi import Depends, Request

from raypod import errors
from raypod.controlplane import identity

SESSION_COOKIE = "raypod_session"
CSRF_HEADER = "x-csrf-token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
CACHE_TTL_S = 5.0


class TokenCache:
    """Remembers authenticated tokens briefly, so a proxied request costs no database read; revocation and
    expiry through this server clear or bound it."""

    def __init__(self, ttl_s: float = CACHE_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._entries: dict[str, tuple[float, identity.Principal, float | None]] = {}
        self._lock = threading.Lock()

    def get(self, token: str) -> identity.Principal | None:
        with self._lock:
            entry = self._entries.get(token)
        if entry is None:
            return None
        cached_at, principal, expires_at = entry
        now = time.time()
        if now - cached_at > self.ttl_s or (expires_at is not None and now >= expires_at):
            return None
        return principal

    def put(self, token: str, principal: identity.Principal, expires_at: float | None) -> None:
        with self._lock:
            self._entries[token] = (time.time(), principal, expires_at)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


def identities(request: Request) -> identity.IdentityService:
    service: identity.IdentityService = request.app.state.identities
    return service


def authenticate(request: Request) -> identity.Principal:
    """FastAPI dependency for every non-public route.

    Raises:
        Unauthenticated: no, unknown, expired or revoked credentials. Forbidden: a session without CSRF header.
    """
    ids = identities(request)
    header = request.headers.get("authorization")
    if header:
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            raise errors.Unauthenticated("use 'Authorization: Bearer <token>'")
        return _cached(ids, request.app.state.token_cache, value.strip())
    session_id = request.cookies.get(SESSION_COOKIE)
    if session_id:
        principal = ids.authenticate_session(session_id)
        if request.method not in SAFE_METHODS:
            sent = request.headers.get(CSRF_HEADER, "")
            if not principal.session_csrf or not hmac.compare_digest(sent, principal.session_csrf):
                raise errors.Forbidden(f"missing or wrong {CSRF_HEADER} header for a session request")
        return principal
    raise errors.Unauthenticated(
        "no credentials: send 'Authorization: Bearer <token>' (see 'raypod token create') or log in at /login"
    )


def authenticate_websocket(
    ids: identity.IdentityService, cache: TokenCache, authorization: str | None, session_id: str | None
) -> identity.Principal:
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return _cached(ids, cache, value.strip())
    if session_id:
        return ids.authenticate_session(session_id)
    raise errors.Unauthenticated("no credentials")


def _cached(ids: identity.IdentityService, cache: TokenCache, token: str) -> identity.Principal:
    principal = cache.get(token)
    if principal is None:
        principal = ids.authenticate_token(token)
        info = ids.token(token.split("_", 2)[1])
        cache.put(token, principal, info.expires_at.timestamp() if info.expires_at else None)
    return principal


Caller = Annotated[identity.Principal, Depends(authenticate)]
