"""Users, teams, namespaces, tokens and browser login. Managing identities is for admins; anyone manages
their own tokens."""

from __future__ import annotations

import html
from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Depends, Form, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from raypod import state
from raypod.controlplane import governance, identity
from raypod.controlplane.plane import ControlPlane
from raypod.controlplane.sso import SsoService
from raypod.server import audit
from raypod.server.auth import (
    CSRF_HEADER,
    Caller,
    check_same_origin,
    identities,
    session_cookie_name,
    session_id,
    set_session_cookie,
)
from raypod.server.routes import part

router = APIRouter(prefix="/api/v1", tags=["identities"])
login_router = APIRouter(tags=["login"])

Identities = Annotated[identity.IdentityService, Depends(identities)]
Governance = Annotated[governance.GovernanceService, part("governance")]
Plane = Annotated[ControlPlane, part("control_plane")]
Name = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NewUser(_Body):
    name: str = Name
    is_admin: bool = False
    team: str | None = Field(None, max_length=63)
    role: state.Role = state.Role.MEMBER


class NewTeam(_Body):
    name: str = Name


class NewMember(_Body):
    user: str = Name
    role: state.Role = state.Role.MEMBER


class NewNamespace(_Body):
    name: str = Name
    team: str = Name


class NewToken(_Body):
    name: str = Field("cli", min_length=1, max_length=63)
    ttl_seconds: int | None = Field(30 * 86400, ge=1, le=366 * 86400, description="null: never expires")
    user: str | None = Field(None, max_length=63, description="Admins may create tokens for others.")


@router.get("/whoami")
def whoami(caller: Caller, ids: Identities) -> state.UserInfo:
    return ids.user(caller.user)


@router.get("/info")
def server_info(caller: Caller, plane: Plane) -> state.ServerInfo:
    """The server's version, backend and what isolates one namespace's jobs from another's."""
    return plane.info()


@router.get("/users")
def list_users(caller: Caller, ids: Identities) -> list[state.UserInfo]:
    return ids.list_users(by=caller)


@router.post("/users", status_code=201)
def create_user(caller: Caller, body: NewUser, ids: Identities) -> state.UserInfo:
    return ids.create_user(body.name, body.is_admin, by=caller, team=body.team, role=body.role)


@router.delete("/users/{name}")
def delete_user(caller: Caller, name: str, governor: Governance) -> state.OwnerDeleted:
    """Admins. Its tokens and sessions end at once; its queued clusters leave the queue (deleted, with an event);
    its running clusters stay for their team's admins."""
    return governor.delete_user(caller, name)


@router.post("/teams", status_code=201)
def create_team(caller: Caller, body: NewTeam, ids: Identities) -> NewTeam:
    ids.create_team(body.name, by=caller)
    return body


@router.post("/teams/{team}/members", status_code=201)
def add_member(caller: Caller, team: str, body: NewMember, ids: Identities) -> state.UserInfo:
    return ids.add_member(team, body.user, body.role, by=caller)


@router.get("/namespaces")
def list_namespaces(caller: Caller, ids: Identities) -> list[state.NamespaceInfo]:
    return ids.list_namespaces(by=caller)


@router.post("/namespaces", status_code=201)
def create_namespace(caller: Caller, body: NewNamespace, ids: Identities) -> state.NamespaceInfo:
    return ids.create_namespace(body.name, body.team, by=caller)


@router.post("/tokens", status_code=201)
def create_token(caller: Caller, body: NewToken, ids: Identities, request: Request) -> state.CreatedToken:
    ttl = timedelta(seconds=body.ttl_seconds) if body.ttl_seconds else None
    asked = "ttl_seconds" in body.model_fields_set
    max_ttl = request.app.state.settings.session_token_max_ttl
    return ids.issue_token(caller, body.user, body.name, ttl, ttl_asked=asked, session_max_ttl=max_ttl)


@router.get("/tokens")
def list_tokens(caller: Caller, ids: Identities) -> list[state.TokenInfo]:
    return ids.list_tokens(by=caller)


@router.delete("/tokens/{token_id}")
def revoke_token(caller: Caller, token_id: str, ids: Identities) -> state.TokenInfo:
    """Revoke a token; the browser sessions made from it end at once."""
    return ids.revoke_token(token_id, by=caller)


class LoginResult(BaseModel):
    user: str
    csrf_token: str = Field(description=f"Send it as the {CSRF_HEADER} header on unsafe requests.")


@login_router.post("/login")
def login(request: Request, response: Response, ids: Identities, token: Annotated[str, Form()]) -> LoginResult:
    """Exchange an API token for a browser session (HttpOnly, Secure, SameSite=Strict cookie), bound to that
    token: revoking it ends the session. Only this server's own pages may post here (no login CSRF)."""
    check_same_origin(request)
    principal = audit.remember(request.state, ids.authenticate_token(token.strip()[:512]))
    session, csrf = ids.create_session(principal)
    set_session_cookie(request, response, session)
    return LoginResult(user=principal.user, csrf_token=html.escape(csrf))


@login_router.post("/logout")
def logout(request: Request, response: Response, ids: Identities, caller: Caller) -> dict[str, str | None]:
    """End the browser session. One that single sign-on began also ends at the provider: ``provider_logout`` is
    where the console sends the browser for that (the provider sends it back to /login)."""
    session = session_id(request)
    if session:
        ids.end_session(session)
    secure = request.url.scheme == "https"
    response.delete_cookie(session_cookie_name(secure), secure=secure, httponly=True, samesite="strict")
    sso: SsoService | None = request.app.state.sso
    back_to = f"{request.app.state.settings.public_url}/login"
    provider_logout = sso.sign_out(caller.token_id, back_to) if sso is not None and session else None
    return {"user": caller.user, "status": "logged out", "provider_logout": provider_logout}
