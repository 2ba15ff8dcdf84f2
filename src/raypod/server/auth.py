"""Who is calling: a bearer token, or a browser session cookie plus a CSRF header for unsafe methods."""

from __future__ import annotations

import hmac
from typing import Annotated
from urllib.parse import urlsplit

from fastapi import Depends, Request

from raypod import errors
from raypod.controlplane import identity

SESSION_COOKIE = "raypod_session"
CSRF_HEADER = "x-csrf-token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header; the one place that header is parsed.

    Returns None without a header. Raises:
        Unauthenticated: a header of another scheme, or an empty token.
    """
    if authorization is None:
        return None
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        raise errors.Unauthenticated("use 'Authorization: Bearer <token>'")
    return value.strip()


def check_same_origin(request: Request) -> None:
    """Refuse a browser request another site made (login CSRF, cookie-authenticated changes).

    Browsers say where a request comes from (``Origin``, ``Sec-Fetch-Site``); a client that sends neither is not
    a browser acting for another site.

    Raises:
        Forbidden: a cross-site or cross-origin request.
    """
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        raise errors.Forbidden(f"cross-site request refused (Sec-Fetch-Site: {site[:20]})")
    origin = request.headers.get("origin")
    if origin is not None and (origin == "null" or urlsplit(origin).netloc != request.headers.get("host")):
        raise errors.Forbidden("cross-origin request refused: it must come from this server's own pages")


def identities(request: Request) -> identity.IdentityService:
    service: identity.IdentityService = request.app.state.identities
    return service


def authenticate(request: Request) -> identity.Principal:
    """FastAPI dependency for every non-public route.

    Raises:
        Unauthenticated: no, unknown, expired or revoked credentials. Forbidden: a session without CSRF header.
    """
    ids = identities(request)
    token = bearer_token(request.headers.get("authorization"))
    if token is not None:
        return ids.authenticate_token(token)
    session_id = request.cookies.get(SESSION_COOKIE)
    if session_id:
        principal = ids.authenticate_session(session_id)
        if request.method not in SAFE_METHODS:
            check_same_origin(request)
            sent = request.headers.get(CSRF_HEADER, "")
            if not principal.session_csrf or not hmac.compare_digest(sent, principal.session_csrf):
                raise errors.Forbidden(f"missing or wrong {CSRF_HEADER} header for a session request")
        return principal
    raise errors.Unauthenticated(
        "no credentials: send 'Authorization: Bearer <token>' (see 'raypod token create') or log in at /login"
    )


def authenticate_same_origin_browser(request: Request) -> identity.Principal:
    """For pages that are not raypod's own (a workspace's IDE): their scripts cannot send raypod's CSRF header,
    so a session's unsafe request is taken only when the browser itself says it comes from this origin
    (``Sec-Fetch-Site: same-origin`` and a matching ``Origin``). Tokens work as everywhere.

    Raises:
        Unauthenticated, Forbidden: as ``authenticate``, and a session's unsafe request without that assurance.
    """
    if bearer_token(request.headers.get("authorization")) is not None or request.method in SAFE_METHODS:
        return authenticate(request)
    session_id = request.cookies.get(SESSION_COOKIE)
    if not session_id:
        return authenticate(request)
    principal = identities(request).authenticate_session(session_id)
    check_same_origin(request)
    if request.headers.get("sec-fetch-site") != "same-origin":
        raise errors.Forbidden("a session's change must come from a page of this server (Sec-Fetch-Site)")
    return principal


def authenticate_websocket(
    ids: identity.IdentityService, authorization: str | None, session_id: str | None
) -> identity.Principal:
    token = bearer_token(authorization)
    if token is not None:
        return ids.authenticate_token(token)
    if session_id:
        return ids.authenticate_session(session_id)
    raise errors.Unauthenticated("no credentials")


Caller = Annotated[identity.Principal, Depends(authenticate)]
