"""Single sign-on for the CLI and SDK (the device authorization flow and refresh through the provider) and the
provider's back-channel logout. Public routes: each call is authenticated by what the provider issued (a device
code, a refresh token, a signed logout token), never by a raypod credential. The console's are in
``console/pages.py`` (``/login/sso``)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Form, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from raypod import errors
from raypod.controlplane.sso import SignedIn, SsoService
from raypod.server import audit

router = APIRouter(prefix="/api/v1/sso", tags=["sso"])
login_router = APIRouter(tags=["sso"], include_in_schema=False)


class SsoInfo(BaseModel):
    enabled: bool
    name: str = ""
    issuer: str = ""


class DeviceLogin(BaseModel):
    device_code: str
    user_code: str
    verification_uri: str
    verification_uri_complete: str | None = None
    expires_in: int
    interval: int


class DeviceCode(BaseModel):
    model_config = ConfigDict(extra="forbid")
    device_code: str = Field(min_length=1, max_length=512)


class RefreshToken(BaseModel):
    model_config = ConfigDict(extra="forbid")
    refresh_token: str = Field(min_length=1, max_length=4096)


class SsoToken(BaseModel):
    """A raypod token for the signed-in user, and the provider's refresh token to get the next one."""

    status: str = "signed-in"
    user: str
    token: str = ""
    token_id: str = ""
    expires_at: datetime | None = None
    refresh_token: str | None = None


def _sso(request: Request) -> SsoService:
    found: SsoService | None = request.app.state.sso
    if found is None:
        raise errors.NotFound("single sign-on is not configured on this server (RAYPOD_SSO_ISSUER)")
    return found


def _answer(request: Request, signed: SignedIn) -> SsoToken:
    audit.remember(request.state, signed.principal)
    return SsoToken(
        user=signed.principal.user,
        token=signed.token.token,
        token_id=signed.token.id,
        expires_at=signed.token.expires_at,
        refresh_token=signed.refresh_token,
    )


@router.get("")
def sso_info(request: Request) -> SsoInfo:
    """Public: whether this server signs users in with a provider, and which."""
    found: SsoService | None = request.app.state.sso
    if found is None:
        return SsoInfo(enabled=False)
    return SsoInfo(enabled=True, name=found.settings.display_name, issuer=found.settings.issuer)


@router.post("/device")
def begin_device_login(request: Request) -> DeviceLogin:
    """Public: start a device login at the provider; show its user code and URL, then poll ``/device/token``."""
    found = _sso(request).begin_device_login()
    return DeviceLogin(**found.__dict__)


@router.post("/device/token", responses={202: {"description": "The user has not finished at the provider yet."}})
def finish_device_login(request: Request, body: DeviceCode, response: Response) -> SsoToken:
    """Public: 202 while the user has not finished at the provider; then a raypod token for them."""
    signed = _sso(request).poll_device(body.device_code)
    if signed is None:
        response.status_code = 202
        return SsoToken(status="pending", user="")
    return _answer(request, signed)


@router.post("/refresh")
def refresh(request: Request, body: RefreshToken) -> SsoToken:
    """Public: a new raypod token through the provider, which says who the user is and which groups they are in
    now (403 for one no longer in a group raypod maps)."""
    return _answer(request, _sso(request).refresh(body.refresh_token))


@login_router.post("/login/sso/backchannel-logout")
def backchannel_logout(request: Request, logout_token: Annotated[str, Form(max_length=8192)]) -> dict[str, int]:
    """Public, for the provider (OpenID Connect Back-Channel Logout): the raypod tokens minted for that provider
    session or user are revoked, which ends their console sessions at once."""
    return {"revoked": _sso(request).backchannel_logout(logout_token)}
