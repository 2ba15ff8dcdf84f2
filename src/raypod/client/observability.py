"""The SDK's monitoring: the Prometheus raypod runs and its dashboards."""

from __future__ import annotations

import builtins
from typing import Any

from raypod.client._calls import namespaced_path
from raypod.client._http import Transport


class Monitoring:
    """What Prometheus discovers, raypod's own metrics and a cluster's console charts."""

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def targets(self, job: str = "ray") -> builtins.list[dict[str, Any]]:
        """Prometheus HTTP service discovery: every alive node (``job="ray"``) or raypod itself (``"raypod"``)."""
        found: builtins.list[dict[str, Any]] = self._t.request("GET", "/api/v1/monitoring/sd", params={"job": job})
        return found

    def metrics(self) -> str:
        """raypod's own metrics in Prometheus' text format (admins)."""
        return str(self._t.request_text("GET", "/metrics"))

    def charts(self, cluster: str, namespace: str = "default") -> dict[str, Any]:
        result: dict[str, Any] = self._t.request("GET", namespaced_path(namespace, cluster, "charts"))
        return result
