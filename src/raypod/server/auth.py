"""Who is calling: a bearer token, or a browser session cookie plus a CSRF header for unsafe methods."""

from __future__ import annotations

import hmac
from typing import Annotated
from urllib.parse import urlsplit

from fastapi import Depends, Request, Response
from starlette.requests import HTTPConnection

from raypod import errors
from raypod.controlplane import identity
from raypod.server import audit

SESSION_COOKIE = "raypod_session"  # over plain HTTP (tests, a loopback-only server without TLS)
# Over TLS: a ``__Host-`` cookie is host-only and Secure by rule, so no sibling host (a cluster's own origin
# under the same domain) can set or shadow it.
SECURE_SESSION_COOKIE = "__Host-raypod_session"
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


def session_cookie_name(secure: bool) -> str:
    return SECURE_SESSION_COOKIE if secure else SESSION_COOKIE


def set_session_cookie(request: Request, response: Response, session: str) -> None:
    """The console's session cookie: HttpOnly, Secure over TLS, SameSite=Strict; the one place it is set."""
    secure = request.url.scheme == "https"
    response.set_cookie(
        session_cookie_name(secure),
        session,
        httponly=True,
        secure=secure,
        samesite="strict",
        max_age=int(identity.SESSION_TTL.total_seconds()),
    )


def session_id(connection: HTTPConnection) -> str | None:
    """The console session cookie of a request or websocket: the ``__Host-`` one over TLS, the plain one over
    HTTP, never the other (a plain-named cookie over TLS may have been set by a sibling host)."""
    return connection.cookies.get(session_cookie_name(connection.url.scheme in ("https", "wss"))) or None


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
        return audit.remember(request.state, ids.authenticate_token(token))
    session = session_id(request)
    if session:
        principal = audit.remember(request.state, ids.authenticate_session(session))
        if request.method not in SAFE_METHODS:
            check_same_origin(request)
            sent = request.headers.get(CSRF_HEADER, "")
            if not principal.session_csrf or not hmac.compare_digest(sent, principal.session_csrf):
                raise errors.Forbidden(f"missing or wrong {CSRF_HEADER} header for a session request")
        return principal
    raise errors.Unauthenticated(
        "no credentials: send 'Authorization: Bearer <token>' (see 'raypod token create') or log in at /login"
    )


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


def same_origin_path(value: str) -> str:
    """``value`` if it is a path on this origin as a browser reads it, else ``/`` (no open redirect): no scheme,
    no host, no backslash or control character (browsers read ``/\\evil`` and ``/<tab>/evil`` as ``//evil``)."""
    if not value.startswith("/") or any(ord(c) < 0x21 or c in "\\\x7f" for c in value):
        return "/"
    parts = urlsplit(value)
    return value if not parts.scheme and not parts.netloc and not value.startswith("//") else "/"
