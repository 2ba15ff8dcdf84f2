"""The SDK's tokens, users, teams and namespaces."""

from __future__ import annotations

import builtins

from raypod import errors, state
from raypod.client._calls import checked_name
from raypod.client._http import Transport


class Tokens:
    """``raypod token create|list|revoke``; a created token's secret is in the answer only."""

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def create(
        self, name: str = "cli", ttl_seconds: int | None = 30 * 86400, user: str | None = None
    ) -> state.CreatedToken:
        body = {"name": name, "ttl_seconds": ttl_seconds, "user": user}
        return state.CreatedToken.model_validate(self._t.request("POST", "/api/v1/tokens", json=body))

    def list(self) -> builtins.list[state.TokenInfo]:
        return [state.TokenInfo.model_validate(t) for t in self._t.request("GET", "/api/v1/tokens")]

    def revoke(self, token_id: str) -> state.TokenInfo:
        """Revoke a token; browser sessions made from it end at once."""
        if not token_id.replace("-", "").isalnum() or len(token_id) > 16:
            raise errors.InvalidSpec(f"'{token_id[:40]}' is not a token id (see 'raypod token list')")
        return state.TokenInfo.model_validate(self._t.request("DELETE", f"/api/v1/tokens/{token_id}"))


class Users:
    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def create(
        self, name: str, team: str | None = None, role: state.Role = state.Role.MEMBER, is_admin: bool = False
    ) -> state.UserInfo:
        body = {"name": name, "team": team, "role": state.Role(role).value, "is_admin": is_admin}
        return state.UserInfo.model_validate(self._t.request("POST", "/api/v1/users", json=body))

    def list(self) -> builtins.list[state.UserInfo]:
        return [state.UserInfo.model_validate(u) for u in self._t.request("GET", "/api/v1/users")]

    def delete(self, name: str) -> state.OwnerDeleted:
        """Admins: revoke the user's tokens and sessions; its queued clusters leave the queue."""
        return state.OwnerDeleted.model_validate(self._t.request("DELETE", f"/api/v1/users/{checked_name(name)}"))

    def whoami(self) -> state.UserInfo:
        return state.UserInfo.model_validate(self._t.request("GET", "/api/v1/whoami"))


class Teams:
    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def create(self, name: str) -> state.TeamInfo:
        return state.TeamInfo.model_validate(self._t.request("POST", "/api/v1/teams", json={"name": name}))

    def add_member(self, team: str, user: str, role: state.Role = state.Role.MEMBER) -> state.UserInfo:
        body = {"user": user, "role": state.Role(role).value}
        return state.UserInfo.model_validate(
            self._t.request("POST", f"/api/v1/teams/{checked_name(team)}/members", json=body)
        )


class Namespaces:
    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def create(self, name: str, team: str) -> state.NamespaceInfo:
        body = {"name": name, "team": team}
        return state.NamespaceInfo.model_validate(self._t.request("POST", "/api/v1/namespaces", json=body))

    def list(self) -> builtins.list[state.NamespaceInfo]:
        return [state.NamespaceInfo.model_validate(n) for n in self._t.request("GET", "/api/v1/namespaces")]
