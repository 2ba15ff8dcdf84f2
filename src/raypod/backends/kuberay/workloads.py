"""The KubeRay backend's ``RayJobRunner`` and ``ServiceRunner`` parts: a job as its own ``RayJob``, a model
deployment as its own ``RayService``, followed through the backend's informers."""

from __future__ import annotations

import json
import threading
from typing import Any

from kubernetes import client

from raypod import errors
from raypod.backends import base
from raypod.backends.kuberay import kvstore, manifests
from raypod.backends.kuberay.informer import Informer
from raypod.backends.kuberay.objects import merge_patch
from raypod.backends.kuberay.tokens import UID_LABEL

GROUP, VERSION = "ray.io", "v1"


class RayWorkloads:
    """Mixed into ``KubeRayBackend``, whose informers, client and calls it uses."""

    _api: client.ApiClient
    _custom: client.CustomObjectsApi
    _in_cluster: bool
    _timeout: float
    rayjobs: Informer
    rayservices: Informer
    _lock: threading.Lock
    _kv_clusters: set[str]

    def _call(self, doing: str, call: Any, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def _write(self, plural: str, kind: str, current: dict[str, Any] | None, desired: dict[str, Any]) -> None:
        raise NotImplementedError

    # -- RayJobRunner --------------------------------------------------------------------------------------

    def submit_rayjob(self, manifest: dict[str, Any]) -> None:
        namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        self._call(
            f"create RayJob {namespace}/{name}",
            self._custom.create_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            "rayjobs",
            manifest,
            _request_timeout=self._timeout,
        )

    def rayjob_status(self, namespace: str, name: str) -> tuple[str, str] | None:
        item = self.rayjobs.get(namespace, name)
        if item is None:
            return None
        status = item.get("status") or {}
        message = str(status.get("message") or status.get("reason") or "")
        if status.get("jobDeploymentStatus") == "Failed" and status.get("jobStatus") != "SUCCEEDED":
            return "FAILED", message or "KubeRay could not run the job (jobDeploymentStatus: Failed)"
        return str(status.get("jobStatus") or "PENDING"), message

    def delete_rayjob(self, namespace: str, name: str) -> None:
        self._call(
            f"delete RayJob {namespace}/{name}",
            self._custom.delete_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            "rayjobs",
            name,
            _request_timeout=self._timeout,
        )

    # -- ServiceRunner -------------------------------------------------------------------------------------

    def apply_rayservice(self, cluster_id: str, manifest: dict[str, Any]) -> None:
        """Raises TransientError (not visible yet, 409: again), PermanentError (RBAC, no CRD, not ours)."""
        namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        manifest = json.loads(json.dumps(manifest))
        manifest["metadata"]["labels"][UID_LABEL] = cluster_id
        with self._lock:
            uses_kv = cluster_id in self._kv_clusters
        if uses_kv:
            kvstore.mount(manifest, manifest["metadata"]["labels"]["raypod.io/cluster"])
        if not self.rayservices.synced:
            raise errors.TransientError(f"RayServices are not visible yet: {self.rayservices.error or 'listing'}")
        current = self.rayservices.get(namespace, name)
        if current is not None and current["metadata"].get("labels", {}).get(UID_LABEL) != cluster_id:
            raise errors.PermanentError(
                f"a RayService {name} in namespace {namespace} exists that raypod did not create for this cluster; "
                "delete it or deploy under another name"
            )
        if current is None or merge_patch({"spec": current.get("spec", {})}, {"spec": manifest["spec"]}):
            self._write("rayservices", "RayService", current, manifest)

    def rayservice_state(self, namespace: str, name: str) -> base.ServiceState | None:
        item = self.rayservices.get(namespace, name)
        if item is None:
            return None
        app = item["metadata"].get("labels", {}).get(manifests.APP_LABEL, "")
        status = item.get("status") or {}
        found = ((status.get("activeServiceStatus") or {}).get("applicationStatuses") or {}).get(app)
        if found is None:
            pending = (status.get("pendingServiceStatus") or {}).get("applicationStatuses") or {}
            waiting = "KubeRay is starting the RayService's cluster and its Serve application"
            return base.ServiceState("DEPLOYING", str((pending.get(app) or {}).get("message") or waiting), {})
        deployments = {
            str(deployment): str((detail or {}).get("status", ""))
            for deployment, detail in (found.get("serveDeploymentStatuses") or {}).items()
        }
        return base.ServiceState(str(found.get("status") or "UNKNOWN"), str(found.get("message") or ""), deployments)

    def delete_rayservice(self, namespace: str, name: str) -> None:
        self._call(
            f"delete RayService {namespace}/{name}",
            self._custom.delete_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            "rayservices",
            name,
            _request_timeout=self._timeout,
        )

    def serve_endpoints(self, cluster_id: str) -> dict[str, str]:
        found = {}
        for item in self.rayservices.items():
            labels = item["metadata"].get("labels", {})
            if labels.get(UID_LABEL) != cluster_id or item["metadata"].get("deletionTimestamp"):
                continue
            namespace, name = item["metadata"]["namespace"], item["metadata"]["name"]
            service = f"{name}-serve-svc"
            if self._in_cluster:
                url = f"http://{service}.{namespace}.svc:{manifests.SERVE_PORT}"
            else:
                host = self._api.configuration.host.rstrip("/")
                url = f"{host}/api/v1/namespaces/{namespace}/services/{service}:serve/proxy"
            found[labels.get(manifests.APP_LABEL, "")] = url
        return found
