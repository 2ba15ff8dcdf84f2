"""Users, teams, namespaces, tokens and browser login. Managing identities is for admins; anyone manages
their own tokens."""

from __future__ import annotations

import html
from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Depends, Form, Request, Response
from pydantic import BaseModel, ConfigDict, Field

import raypod
from raypod import errors, state
from raypod.controlplane import governance, identity, store
from raypod.server.auth import CSRF_HEADER, Caller, check_same_origin, identities, session_cookie_name, session_id

router = APIRouter(prefix="/api/v1", tags=["identities"])
login_router = APIRouter(tags=["login"])

Identities = Annotated[identity.IdentityService, Depends(identities)]
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


def _require_admin(caller: identity.Principal, what: str) -> None:
    if not caller.is_admin:
        raise errors.Forbidden(f"only admins may {what}")


@router.get("/whoami")
def whoami(caller: Caller, ids: Identities) -> state.UserInfo:
    return ids.user(caller.user)


@router.get("/info")
def server_info(caller: Caller, request: Request) -> state.ServerInfo:
    """The server's version, backend and what isolates one namespace's jobs from another's."""
    backend = request.app.state.clusters.backend
    return state.ServerInfo(
        version=raypod.__version__,
        backend=type(backend).__name__,
        tenancy=backend.tenancy.summary,
        isolated=backend.tenancy.isolated,
    )


@router.get("/users")
def list_users(caller: Caller, ids: Identities) -> list[state.UserInfo]:
    _require_admin(caller, "list users")
    return ids.list_users()


@router.post("/users", status_code=201)
def create_user(caller: Caller, body: NewUser, ids: Identities) -> state.UserInfo:
    _require_admin(caller, "create users")
    ids.create_user(body.name, body.is_admin)
    if body.team:
        ids.add_member(body.team, body.name, body.role)
    return ids.user(body.name)


@router.delete("/users/{name}")
def delete_user(caller: Caller, name: str, ids: Identities, request: Request) -> state.OwnerDeleted:
    """Admins. Its tokens and sessions end at once; its queued clusters leave the queue (deleted, with an event);
    its running clusters stay for their team's admins."""
    _require_admin(caller, "delete users")
    ids.delete_user(name)
    governor: governance.GovernanceService = request.app.state.governance
    return governor.on_owner_deleted(name)


@router.post("/teams", status_code=201)
def create_team(caller: Caller, body: NewTeam, ids: Identities) -> NewTeam:
    _require_admin(caller, "create teams")
    ids.create_team(body.name)
    return body


@router.post("/teams/{team}/members", status_code=201)
def add_member(caller: Caller, team: str, body: NewMember, ids: Identities) -> state.UserInfo:
    if not caller.is_admin and caller.teams.get(team) is not state.Role.ADMIN:
        raise errors.Forbidden(f"only admins or admins of team '{team}' may add members")
    ids.add_member(team, body.user, body.role)
    return ids.user(body.user)


@router.get("/namespaces")
def list_namespaces(caller: Caller, ids: Identities) -> list[state.NamespaceInfo]:
    found = ids.list_namespaces()
    return found if caller.is_admin else [ns for ns in found if ns.team in caller.teams]


@router.post("/namespaces", status_code=201)
def create_namespace(caller: Caller, body: NewNamespace, ids: Identities) -> state.NamespaceInfo:
    _require_admin(caller, "create namespaces")
    return ids.create_namespace(body.name, body.team)


@router.post("/tokens", status_code=201)
def create_token(caller: Caller, body: NewToken, ids: Identities, request: Request) -> state.CreatedToken:
    user = body.user or caller.user
    if user != caller.user:
        _require_admin(caller, "create tokens for other users")
    ttl = timedelta(seconds=body.ttl_seconds) if body.ttl_seconds else None
    # A browser session may not mint a token that lives longer than a bound (a stolen cookie must not turn into a
    # year-long credential); and a token made with a token (or a session's) never outlives it and dies with it.
    # An admin's token for another user is that user's own, not a child of the admin's.
    not_after = None
    if caller.via_session:
        not_after = store.now() + request.app.state.settings.session_token_max_ttl
    parent = caller.token_id if user == caller.user else None
    if "ttl_seconds" not in body.model_fields_set and ttl is not None:
        # The default lifetime, asked for implicitly, ends with what bounds it rather than being refused.
        bounds = [not_after, caller.token_expires_at if parent else None]
        ends = min((b for b in bounds if b is not None), default=None)
        if ends is not None:
            ttl = max(timedelta(seconds=1), min(ttl, ends - store.now() - timedelta(seconds=1)))
    return ids.create_token(user, body.name, ttl, not_after=not_after, parent=parent)


@router.get("/tokens")
def list_tokens(caller: Caller, ids: Identities) -> list[state.TokenInfo]:
    return ids.list_tokens(None if caller.is_admin else caller.user)


@router.delete("/tokens/{token_id}")
def revoke_token(caller: Caller, token_id: str, ids: Identities) -> state.TokenInfo:
    """Revoke a token; the browser sessions made from it end at once."""
    found = ids.token(token_id)
    if found.user != caller.user and not caller.is_admin:
        raise errors.NotFound(f"token '{token_id[:16]}' not found")  # as one that does not exist: ids are not told
    return ids.revoke_token(found.id)


class LoginResult(BaseModel):
    user: str
    csrf_token: str = Field(description=f"Send it as the {CSRF_HEADER} header on unsafe requests.")


@login_router.post("/login")
def login(request: Request, response: Response, ids: Identities, token: Annotated[str, Form()]) -> LoginResult:
    """Exchange an API token for a browser session (HttpOnly, Secure, SameSite=Strict cookie), bound to that
    token: revoking it ends the session. Only this server's own pages may post here (no login CSRF)."""
    check_same_origin(request)
    principal = ids.authenticate_token(token.strip()[:512])
    session, csrf = ids.create_session(principal)
    response.set_cookie(
        session_cookie_name(request.url.scheme == "https"),
        session,
        httponly=True,
        secure=request.url.scheme == "https",
        samesite="strict",
        max_age=int(identity.SESSION_TTL.total_seconds()),
    )
    return LoginResult(user=principal.user, csrf_token=html.escape(csrf))


@login_router.post("/logout")
def logout(request: Request, response: Response, ids: Identities, caller: Caller) -> dict[str, str]:
    session = session_id(request)
    if session:
        ids.end_session(session)
    secure = request.url.scheme == "https"
    response.delete_cookie(session_cookie_name(secure), secure=secure, httponly=True, samesite="strict")
    return {"user": caller.user, "status": "logged out"}
