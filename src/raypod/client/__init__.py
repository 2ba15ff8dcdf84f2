"""The Python SDK. ``raypod.Client`` is what the CLI itself uses; it reaches the server only over HTTP."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import httpx

from raypod import config, errors, state
from raypod.client import sso
from raypod.client._http import Transport
from raypod.client.audit import Audit
from raypod.client.clusters import Clusters
from raypod.client.governance import Quotas
from raypod.client.identities import Namespaces, Teams, Tokens, Users
from raypod.client.jobs import TERMINAL_JOB_STATUSES, Jobs
from raypod.client.observability import Monitoring
from raypod.client.schedules import Schedules
from raypod.client.serving import Models, Serving
from raypod.client.spaces import Spaces


@dataclasses.dataclass(frozen=True)
class ConnectionSettings:
    server: str
    token: str | None
    verify: str | bool


def connection_settings(
    server: str | None = None, token: str | None = None, verify: str | bool | None = None
) -> ConnectionSettings:
    """Where the server is and how to talk to it: arguments, then RAYPOD_SERVER / RAYPOD_TOKEN /
    RAYPOD_CA_FILE, then the credentials file in RAYPOD_HOME."""
    stored = config.read_credentials()
    ca_file = os.environ.get("RAYPOD_CA_FILE") or stored.get("ca_file")
    if verify is None:
        verify = ca_file if ca_file and os.path.exists(ca_file) else True
    server = server or config.default_server_url()
    if not token and not os.environ.get("RAYPOD_TOKEN") and stored.get("server") == server:
        stored = sso.fresh_credentials(stored, server, verify)  # `raypod login`'s token, refreshed when it ends
    return ConnectionSettings(
        server=server,
        token=token or os.environ.get("RAYPOD_TOKEN") or stored.get("token"),
        verify=verify,
    )


class Client:
    """Entry point of the SDK: ``raypod.Client().clusters.create(spec)``.

    The server comes from ``server``, else ``RAYPOD_SERVER``, else the local default.
    """

    def __init__(
        self,
        server: str | None = None,
        timeout: float = 30.0,
        http: httpx.Client | None = None,
        token: str | None = None,
        verify: str | bool | None = None,
    ) -> None:
        settings = connection_settings(server, token, verify)
        self._transport = Transport(settings.server, timeout, http, settings.token, settings.verify)
        self.server = self._transport.server
        self.clusters = Clusters(self._transport)
        self.jobs = Jobs(self._transport)
        self.models = Models(self._transport)
        self.serving = Serving(self._transport)
        self.spaces = Spaces(self._transport)
        self.tokens = Tokens(self._transport)
        self.users = Users(self._transport)
        self.teams = Teams(self._transport)
        self.namespaces = Namespaces(self._transport)
        self.monitoring = Monitoring(self._transport)
        self.quotas = Quotas(self._transport)
        self.audit = Audit(self._transport)
        self.schedules = Schedules(self._transport)
        self.sso = sso.Sso(self._transport)

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """Call any API route with this client's credentials; errors raise raypod.errors classes."""
        return self._transport.request(method, path, **kwargs)

    def health(self) -> dict[str, Any]:
        """The public liveness answer. Raises ServerUnreachable."""
        result: dict[str, Any] = self._transport.request("GET", "/healthz")
        return result

    def info(self) -> state.ServerInfo:
        """Version, backend and tenancy of the server (what isolates namespaces, and what does not)."""
        return state.ServerInfo.model_validate(self._transport.request("GET", "/api/v1/info"))

    def is_healthy(self) -> bool:
        try:
            self.health()
        except errors.RaypodError:
            return False
        return True

    def close(self) -> None:
        self._transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


__all__ = [
    "TERMINAL_JOB_STATUSES",
    "Client",
    "Clusters",
    "ConnectionSettings",
    "Jobs",
    "Models",
    "Monitoring",
    "Namespaces",
    "Quotas",
    "Serving",
    "Spaces",
    "Teams",
    "Tokens",
    "Users",
    "connection_settings",
]
