"""The SDK's workspaces (docs/spaces.md)."""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import Any

from raypod import state
from raypod.client._calls import poll
from raypod.client._http import Transport


class Spaces:
    """Workspaces: IDEs that join a cluster as zero-compute nodes; names match ``raypod space ...``."""

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def create(
        self,
        name: str,
        cluster: str,
        kind: str = "jupyterlab",
        namespace: str = "default",
        memory: str | int | None = None,
        python_env: str | None = None,
    ) -> state.SpaceView:
        """``python_env``: a Python environment's directory on the nodes' host whose interpreter runs the kernels
        (it needs ipykernel and the cluster's Ray version)."""
        body: dict[str, Any] = {"name": name, "cluster": cluster, "kind": kind}
        if memory is not None:
            body["memory"] = memory
        if python_env is not None:
            body["python_env"] = python_env
        return state.SpaceView.model_validate(
            self._t.request("POST", f"/api/v1/namespaces/{namespace}/spaces", json=body)
        )

    def list(self, namespace: str | None = None) -> builtins.list[state.SpaceView]:
        path = f"/api/v1/namespaces/{namespace}/spaces" if namespace else "/api/v1/spaces"
        return [state.SpaceView.model_validate(s) for s in self._t.request("GET", path)]

    def get(self, name: str, namespace: str = "default") -> state.SpaceView:
        return state.SpaceView.model_validate(self._t.request("GET", f"/api/v1/namespaces/{namespace}/spaces/{name}"))

    def stop(self, name: str, namespace: str = "default") -> state.SpaceView:
        return self._verb(name, namespace, "stop")

    def start(self, name: str, namespace: str = "default") -> state.SpaceView:
        return self._verb(name, namespace, "start")

    def move(self, name: str, cluster: str, namespace: str = "default") -> state.SpaceView:
        return self._verb(name, namespace, "move", {"cluster": cluster})

    def delete(self, name: str, namespace: str = "default", keep_files: bool = True) -> state.SpaceView:
        path = f"/api/v1/namespaces/{namespace}/spaces/{name}"
        payload = self._t.request("DELETE", path, params={"keep_files": str(keep_files).lower()})
        return state.SpaceView.model_validate(payload)

    def wait_ready(
        self,
        name: str,
        namespace: str = "default",
        timeout: float = 300.0,
        on_progress: Callable[[state.SpaceView], None] | None = None,
    ) -> state.SpaceView:
        """Poll until its IDE answers. Raises TransientError (not ready after ``timeout``)."""
        return poll(
            lambda: self.get(name, namespace),
            lambda space: space.state == "Ready",
            timeout=timeout,
            every=0.25,
            on_progress=on_progress,
            late=lambda space: f"workspace {name} still {space.state} after {timeout:.0f} s: {space.message}",
        )

    def url(self, name: str, namespace: str = "default") -> str:
        """The workspace's IDE, on raypod's server (a browser logged in to the console opens it)."""
        return f"{self._t.server.rstrip('/')}/spaces/{namespace}/{name}/"

    def _verb(self, name: str, namespace: str, verb: str, body: dict[str, Any] | None = None) -> state.SpaceView:
        path = f"/api/v1/namespaces/{namespace}/spaces/{name}/{verb}"
        return state.SpaceView.model_validate(self._t.request("POST", path, json=body))
