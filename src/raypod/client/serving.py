"""The SDK's model catalog and deployments."""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import Any

from raypod import errors, state
from raypod import spec as spec_mod
from raypod.client._calls import namespaced_path, poll
from raypod.client._http import Transport
from raypod.serving import catalog


class Models:
    """The model catalog; names match ``raypod model list|add|show|remove`` and ``/api/v1/models``."""

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def list(self) -> builtins.list[catalog.ModelEntry]:
        return [catalog.ModelEntry.model_validate(m) for m in self._t.request("GET", "/api/v1/models")]

    def get(self, model_id: str) -> catalog.ModelEntry:
        return catalog.ModelEntry.model_validate(self._t.request("GET", f"/api/v1/models/{model_id}"))

    def add(
        self,
        model_id: str,
        source: str,
        storage_options: dict[str, Any] | None = None,
        description: str = "",
        replace: bool = False,
        timeout: float = 1800.0,
        on_progress: Callable[[catalog.ModelAddition], None] | None = None,
    ) -> catalog.ModelEntry:
        """The server reads and checksums every file of ``source`` (minutes for a large model); this waits for it.
        Raises InvalidSpec with the server's reason when the source cannot be read."""
        body = catalog.ModelSource(
            id=model_id, source=source, storage_options=storage_options or {}, description=description
        )
        addition = self.request(body, replace)
        if on_progress:
            on_progress(addition)
        done = self.wait_added(model_id, timeout=timeout, on_progress=on_progress)
        assert done.entry is not None
        return done.entry

    def request(self, source: catalog.ModelSource, replace: bool = False) -> catalog.ModelAddition:
        """Ask for a model to be added and return at once (INSPECTING)."""
        payload = self._t.request(
            "POST", "/api/v1/models", json=source.model_dump(mode="json"), params={"replace": replace}
        )
        return catalog.ModelAddition.model_validate(payload)

    def addition(self, model_id: str) -> catalog.ModelAddition:
        return catalog.ModelAddition.model_validate(self._t.request("GET", f"/api/v1/models/{model_id}/addition"))

    def wait_added(
        self,
        model_id: str,
        timeout: float = 1800.0,
        on_progress: Callable[[catalog.ModelAddition], None] | None = None,
    ) -> catalog.ModelAddition:
        def failed(addition: catalog.ModelAddition) -> errors.RaypodError | None:
            if addition.status is catalog.AdditionStatus.FAILED:
                return errors.InvalidSpec(addition.failure or f"model '{model_id}' could not be added")
            return None

        return poll(
            lambda: self.addition(model_id),
            lambda addition: addition.status is catalog.AdditionStatus.ADDED,
            timeout=timeout,
            every=0.5,
            late=lambda addition: f"model '{model_id}' is still {addition.status} after {timeout:.0f}s",
            on_progress=on_progress,
            failed=failed,
        )

    def remove(self, model_id: str) -> catalog.ModelAddition:
        """Remove the entry, or withdraw a request to add it."""
        return catalog.ModelAddition.model_validate(self._t.request("DELETE", f"/api/v1/models/{model_id}"))


class Serving:
    """Models on a cluster's Ray Serve; names match ``raypod serve deploy|list|status|delete``."""

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def deploy(
        self,
        cluster: str,
        spec: spec_mod.ServeDeploySpec | dict[str, Any] | str,
        namespace: str = "default",
        timeout: float = 1800.0,
    ) -> state.DeploymentView:
        """Start a catalog model (``spec`` may be just its id). Checked first: it fits and its files are intact."""
        if isinstance(spec, str):
            spec = spec_mod.ServeDeploySpec(model=spec)
        body = spec.model_dump(mode="json") if isinstance(spec, spec_mod.ServeDeploySpec) else spec
        payload = self._t.request(
            "POST", namespaced_path(namespace, cluster, "deployments"), json=body, timeout=timeout
        )
        return state.DeploymentView.model_validate(payload)

    def list(self, cluster: str, namespace: str = "default") -> builtins.list[state.DeploymentView]:
        found = self._t.request("GET", namespaced_path(namespace, cluster, "deployments"))
        return [state.DeploymentView.model_validate(d) for d in found]

    def get(self, cluster: str, name: str, namespace: str = "default") -> state.DeploymentView:
        payload = self._t.request("GET", namespaced_path(namespace, cluster, f"deployments/{name}"))
        return state.DeploymentView.model_validate(payload)

    def delete(self, cluster: str, name: str, namespace: str = "default") -> state.DeploymentView:
        payload = self._t.request("DELETE", namespaced_path(namespace, cluster, f"deployments/{name}"))
        return state.DeploymentView.model_validate(payload)

    def wait_running(
        self,
        cluster: str,
        name: str,
        namespace: str = "default",
        timeout: float = 600.0,
        on_progress: Callable[[state.DeploymentView], None] | None = None,
    ) -> state.DeploymentView:
        """Poll until Serve runs it. Raises InvalidSpec (it failed to deploy: the message says why),
        TransientError (not running after ``timeout``)."""
        return poll(
            lambda: self.get(cluster, name, namespace),
            lambda d: d.status == "RUNNING",
            timeout=timeout,
            every=1.0,
            on_progress=on_progress,
            failed=lambda d: (
                errors.InvalidSpec(f"deployment {name} failed: {d.message}") if d.status == "DEPLOY_FAILED" else None
            ),
            late=lambda d: f"deployment {name} still {d.status} after {timeout:.0f} s",
        )

    def openai_base_url(self, cluster: str, name: str, namespace: str = "default") -> str:
        """What to give an OpenAI client as ``base_url`` (with a raypod token as its ``api_key``)."""
        return f"{self._t.server.rstrip('/')}/clusters/{namespace}/{cluster}/serve/{name}/v1"
