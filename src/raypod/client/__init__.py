"""The Python SDK. ``raypod.Client`` is what the CLI itself uses; it reaches the server only over HTTP."""

from __future__ import annotations

import builtins
import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any

import httpx

from raypod import config, errors, state
from raypod import spec as spec_mod
from raypod.client._http import Transport


class Clusters:
    """Cluster verbs; names match the CLI (``raypod cluster scale``) and the API (``POST .../scale``)."""

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def create(self, spec: spec_mod.ClusterSpec | dict[str, Any]) -> state.ClusterView:
        body = spec.model_dump(mode="json") if isinstance(spec, spec_mod.ClusterSpec) else spec
        return state.ClusterView.model_validate(self._t.request("POST", "/api/v1/clusters", json=body))

    def get(self, name: str, namespace: str = "default") -> state.ClusterView:
        return state.ClusterView.model_validate(self._t.request("GET", _path(namespace, name)))

    def list(self, namespace: str | None = None) -> list[state.ClusterView]:
        params = {"namespace": namespace} if namespace else {}
        return [
            state.ClusterView.model_validate(item) for item in self._t.request("GET", "/api/v1/clusters", params=params)
        ]

    def scale(self, name: str, group: str, replicas: int, namespace: str = "default") -> state.ClusterView:
        payload = self._t.request("POST", _path(namespace, name, "scale"), json={"group": group, "replicas": replicas})
        return state.ClusterView.model_validate(payload)

    def delete(self, name: str, namespace: str = "default") -> state.ClusterView:
        return state.ClusterView.model_validate(self._t.request("DELETE", _path(namespace, name)))

    def events(self, name: str, namespace: str = "default", limit: int = 200) -> builtins.list[state.Event]:
        payload = self._t.request("GET", _path(namespace, name, "events"), params={"limit": limit})
        return [state.Event.model_validate(item) for item in payload]

    def manifest(self, name: str, namespace: str = "default") -> dict[str, Any]:
        result: dict[str, Any] = self._t.request("GET", _path(namespace, name, "manifest"))
        return result

    def wait_ready(
        self,
        name: str,
        namespace: str = "default",
        timeout: float = 300.0,
        on_progress: Callable[[state.ClusterView], None] | None = None,
    ) -> state.ClusterView:
        """Poll until every desired node runs.

        Raises:
            TransientError: not ready within ``timeout``. PermanentError: the cluster failed.
        """
        deadline = time.monotonic() + timeout
        while True:
            view = self.get(name, namespace)
            if on_progress:
                on_progress(view)
            if view.status.phase is state.ClusterPhase.READY and view.status.observed_generation == view.generation:
                return view
            if view.status.phase is state.ClusterPhase.FAILED:
                raise errors.PermanentError(f"cluster '{name}' failed: {view.status.message}")
            if time.monotonic() > deadline:
                raise errors.TransientError(
                    f"cluster '{name}' not ready after {timeout:.0f} s ({view.status.message}); "
                    f"see 'raypod cluster events {name}'"
                )
            time.sleep(0.25)

    def wait_deleted(self, name: str, namespace: str = "default", timeout: float = 120.0) -> None:
        """Poll until the cluster is gone.

        Raises:
            TransientError: still there after ``timeout``.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.get(name, namespace)
            except errors.NotFound:
                return
            time.sleep(0.25)
        raise errors.TransientError(f"cluster '{name}' still being deleted after {timeout:.0f} s")


@dataclasses.dataclass(frozen=True)
class ConnectionSettings:
    server: str
    token: str | None
    verify: str | bool


def connection_settings(server: str | None = None, token: str | None = None) -> ConnectionSettings:
    """Where the server is and how to talk to it: arguments, then RAYPOD_SERVER / RAYPOD_TOKEN /
    RAYPOD_CA_FILE, then the credentials file in RAYPOD_HOME."""
    stored = config.read_credentials()
    ca_file = os.environ.get("RAYPOD_CA_FILE") or stored.get("ca_file")
    return ConnectionSettings(
        server=server or config.default_server_url(),
        token=token or os.environ.get("RAYPOD_TOKEN") or stored.get("token"),
        verify=ca_file if ca_file and os.path.exists(ca_file) else True,
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
    ) -> None:
        settings = connection_settings(server, token)
        self._transport = Transport(settings.server, timeout, http, settings.token, settings.verify)
        self.server = self._transport.server
        self.clusters = Clusters(self._transport)

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """Call any API route with this client's credentials; errors raise raypod.errors classes."""
        return self._transport.request(method, path, **kwargs)

    def health(self) -> dict[str, Any]:
        result: dict[str, Any] = self._transport.request("GET", "/healthz")
        return result

    def close(self) -> None:
        self._transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _path(namespace: str, name: str, verb: str | None = None) -> str:
    for value, what in ((namespace, "namespace"), (name, "cluster name")):
        if not spec_mod.DNS1123_LABEL.match(value) or len(value) > 63:
            raise errors.InvalidSpec(f"{what} '{value}' is not a valid DNS-1123 label")
    path = f"/api/v1/namespaces/{namespace}/clusters/{name}"
    return f"{path}/{verb}" if verb else path


__all__ = ["Client", "Clusters", "ConnectionSettings", "connection_settings"]
