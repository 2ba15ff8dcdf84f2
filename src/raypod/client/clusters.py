"""The SDK's clusters."""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import Any

from raypod import errors, state
from raypod import spec as spec_mod
from raypod.client._calls import namespaced_path, poll
from raypod.client._http import Transport


class Clusters:
    """Cluster verbs; names match the CLI (``raypod cluster scale``) and the API (``POST .../scale``)."""

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def create(self, spec: spec_mod.ClusterSpec | dict[str, Any]) -> state.ClusterView:
        body = spec.model_dump(mode="json") if isinstance(spec, spec_mod.ClusterSpec) else spec
        return state.ClusterView.model_validate(self._t.request("POST", "/api/v1/clusters", json=body))

    def get(self, name: str, namespace: str = "default") -> state.ClusterView:
        return state.ClusterView.model_validate(self._t.request("GET", namespaced_path(namespace, name)))

    def list(self, namespace: str | None = None) -> list[state.ClusterView]:
        params = {"namespace": namespace} if namespace else {}
        return [
            state.ClusterView.model_validate(item) for item in self._t.request("GET", "/api/v1/clusters", params=params)
        ]

    def scale(self, name: str, group: str, replicas: int, namespace: str = "default") -> state.ClusterView:
        payload = self._t.request(
            "POST", namespaced_path(namespace, name, "scale"), json={"group": group, "replicas": replicas}
        )
        return state.ClusterView.model_validate(payload)

    def resume(self, name: str, namespace: str = "default") -> state.ClusterView:
        """Bring a suspended cluster back (it queues when its team is at its quota)."""
        return state.ClusterView.model_validate(self._t.request("POST", namespaced_path(namespace, name, "resume")))

    def delete(self, name: str, namespace: str = "default") -> state.ClusterView:
        return state.ClusterView.model_validate(self._t.request("DELETE", namespaced_path(namespace, name)))

    def replace_node(self, name: str, node: str, namespace: str = "default") -> state.ClusterView:
        """Drain (when it answers) and replace one node, whatever the recovery mode or the flapping guard."""
        return self._node_action(name, node, "replace", namespace)

    def cordon_node(self, name: str, node: str, namespace: str = "default") -> state.ClusterView:
        """Hold a node out of automatic recovery (to inspect it) until ``uncordon_node``."""
        return self._node_action(name, node, "cordon", namespace)

    def uncordon_node(self, name: str, node: str, namespace: str = "default") -> state.ClusterView:
        return self._node_action(name, node, "uncordon", namespace)

    def _node_action(self, name: str, node: str, action: str, namespace: str) -> state.ClusterView:
        payload = self._t.request("POST", namespaced_path(namespace, name, f"nodes/{node}/{action}"))
        return state.ClusterView.model_validate(payload)

    def history(self, name: str, namespace: str = "default") -> state.DeletedCluster:
        """A deleted cluster as history kept it: its last nodes, its events and its jobs."""
        found = self._t.request("GET", f"/api/v1/namespaces/{namespace}/clusters/{name}/history")
        return state.DeletedCluster.model_validate(found)

    def events(self, name: str, namespace: str = "default", limit: int = 200) -> builtins.list[state.Event]:
        payload = self._t.request("GET", namespaced_path(namespace, name, "events"), params={"limit": limit})
        return [state.Event.model_validate(item) for item in payload]

    def manifest(self, name: str, namespace: str = "default") -> dict[str, Any]:
        result: dict[str, Any] = self._t.request("GET", namespaced_path(namespace, name, "manifest"))
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
        return poll(
            lambda: self.get(name, namespace),
            lambda v: v.status.phase is state.ClusterPhase.READY and v.status.observed_generation == v.generation,
            timeout=timeout,
            every=0.25,
            on_progress=on_progress,
            failed=lambda v: (
                errors.PermanentError(f"cluster '{name}' failed: {v.status.message}")
                if v.status.phase is state.ClusterPhase.FAILED
                else None
            ),
            late=lambda v: (
                f"cluster '{name}' not ready after {timeout:.0f} s ({v.status.message}); "
                f"see 'raypod cluster events {name}'"
            ),
        )

    def wait_deleted(self, name: str, namespace: str = "default", timeout: float = 120.0) -> None:
        """Poll until the cluster is gone.

        Raises:
            TransientError: still there after ``timeout``.
        """

        def gone() -> bool:
            try:
                self.get(name, namespace)
            except errors.NotFound:
                return True
            return False

        late = f"cluster '{name}' still being deleted after {timeout:.0f} s"
        poll(gone, bool, timeout=timeout, every=0.25, late=lambda _: late)
