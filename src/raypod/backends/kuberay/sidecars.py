"""What a cluster's node add-ons need beside its pods on Kubernetes: the ConfigMap of their files, the Secret of
the sidecars' tokens, a PersistentVolumeClaim per bound directory, and a Service per sidecar endpoint (a
workspace's IDE); and, from the pods KubeRay runs, the endpoints that answer."""

from __future__ import annotations

import base64
import hashlib
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any

from raypod import addons, errors
from raypod import spec as spec_mod
from raypod.backends.kuberay import addons as pod_addons
from raypod.backends.kuberay.objects import Objects, manifest

FILES_REQUEST = "10Gi"
RECHECK_S = 300.0  # a workspace's claim: the size asked of the cluster's default StorageClass


@dataclass(frozen=True)
class Endpoint:
    group: str
    name: str  # the cluster endpoint: space/<name>
    service: str
    port: int


class AddonObjects:
    def __init__(self, objects: Objects, files_request: str = FILES_REQUEST) -> None:
        self.objects = objects
        self.files_request = files_request
        self._lock = threading.Lock()
        self._endpoints: dict[str, list[Endpoint]] = {}  # cluster uid -> its sidecars' endpoints
        self._tokens: dict[str, dict[str, str]] = {}  # cluster uid -> the sidecar Secret's values
        # cluster uid -> the digest of the add-ons last made for it, and when (an object deleted behind raypod's back
        # is made again within RECHECK_S)
        self._applied: dict[str, tuple[str, float]] = {}

    def apply(self, cluster_id: str, spec: spec_mod.ClusterSpec, per_group: dict[str, addons.NodeAddons]) -> None:
        """Create or update what the groups' add-ons need, before the RayCluster whose pods mount them.

        Raises TransientError, PermanentError (as ``Objects.ensure``)."""
        namespace, cluster = spec.namespace, spec.name
        wanted = pod_addons.objects_wanted(per_group.items())
        # apply runs each pass a cluster is looked at: what was made for the same add-ons costs no API call again.
        digest = hashlib.sha256(repr((namespace, cluster, sorted(per_group.items()))).encode()).hexdigest()
        with self._lock:
            last = self._applied.get(cluster_id)
        if last is not None and last[0] == digest and time.monotonic() - last[1] < RECHECK_S:
            return
        name = pod_addons.files_configmap(cluster)
        if wanted["files"]:
            binary = {key: base64.b64encode(data).decode() for key, data in wanted["files"].items()}
            self.objects.ensure(manifest("ConfigMap", namespace, name, binaryData=binary), cluster_id)
        else:
            self.objects.delete("ConfigMap", namespace, name, cluster_id)
        if wanted["tokens"] or wanted["secrets"]:
            self._ensure_secret(cluster_id, namespace, cluster, wanted["tokens"], wanted["secrets"])
        for path in wanted["binds"]:
            claim = manifest(
                "PersistentVolumeClaim",
                namespace,
                pod_addons.claim_name(path),
                spec={"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": self.files_request}}},
            )
            claim["metadata"]["annotations"] = {"raypod.io/path": path}
            self.objects.ensure(claim, None, update=False)
        endpoints = [
            Endpoint(group, port.endpoint, pod_addons.service_name(cluster, port.endpoint), port.port)
            for group, found in sorted(per_group.items())
            for port in pod_addons.sidecar_ports(found)
        ]
        for endpoint in endpoints:
            service = manifest(
                "Service",
                namespace,
                endpoint.service,
                spec={
                    "selector": {"ray.io/cluster": cluster, "ray.io/group": endpoint.group},
                    "ports": [{"name": "sidecar", "port": endpoint.port, "targetPort": endpoint.port}],
                },
            )
            self.objects.ensure(service, cluster_id)
        with self._lock:
            before = self._endpoints.get(cluster_id, [])
            self._endpoints[cluster_id] = endpoints
        for gone in {e.service for e in before} - {e.service for e in endpoints}:
            self.objects.delete("Service", namespace, gone, cluster_id)
        with self._lock:
            self._applied[cluster_id] = (digest, time.monotonic())

    def delete(self, cluster_id: str, spec: spec_mod.ClusterSpec) -> None:
        """What the cluster's add-ons had, but the claims: a workspace's files outlive its cluster."""
        namespace, cluster = spec.namespace, spec.name
        with self._lock:
            known = self._endpoints.pop(cluster_id, [])
            self._tokens.pop(cluster_id, None)
            self._applied.pop(cluster_id, None)
        services = {e.service for e in known} | {
            pod_addons.service_name(cluster, f"space/{space.name}") for space in spec.spaces
        }
        for service in sorted(services):
            self.objects.delete("Service", namespace, service, cluster_id)
        self.objects.delete("ConfigMap", namespace, pod_addons.files_configmap(cluster), cluster_id)
        self.objects.delete("Secret", namespace, pod_addons.sidecar_secret(cluster), cluster_id)

    def delete_claim(self, namespace: str, path: str) -> None:
        self.objects.delete("PersistentVolumeClaim", namespace, pod_addons.claim_name(path), None)

    def endpoints(self, cluster_id: str, ready_groups: set[str], url: Any) -> dict[str, str]:
        """The sidecar endpoints whose pod is ready: ``url(service, port)`` says how raypod reaches a Service."""
        with self._lock:
            known = list(self._endpoints.get(cluster_id, []))
        return {e.name: url(e.service, e.port) for e in known if e.group in ready_groups}

    def token(self, cluster_id: str, namespace: str, cluster: str, group: str, sidecar: str) -> str:
        """A sidecar's token, from the cluster's sidecar Secret. Raises NotFound (none), TransientError."""
        key = pod_addons.token_key(group, sidecar)
        with self._lock:
            cached = self._tokens.get(cluster_id, {}).get(key)
        if cached is not None:
            return cached
        secret = self.objects.read("Secret", namespace, pod_addons.sidecar_secret(cluster))
        values = _decoded(secret)
        if key not in values:
            raise errors.NotFound(f"node {group} has no sidecar {sidecar} with a token")
        with self._lock:
            self._tokens[cluster_id] = values
        return values[key]

    def _ensure_secret(
        self, cluster_id: str, namespace: str, cluster: str, tokens: list[str], given: dict[str, str]
    ) -> None:
        """Each token key a random token once, kept for as long as the cluster lives (the IDE has it); the given
        values as they are."""

        def keep(current: dict[str, Any], desired: dict[str, Any]) -> dict[str, Any]:
            kept = dict(current.get("data") or {})
            desired["data"] = {
                key: value if key in given else kept.get(key, value) for key, value in desired["data"].items()
            }
            return desired

        made = {key: secrets.token_urlsafe(32) for key in sorted(tokens)}
        data = {key: base64.b64encode(value.encode()).decode() for key, value in {**made, **given}.items()}
        made = self.objects.ensure(
            manifest("Secret", namespace, pod_addons.sidecar_secret(cluster), type="Opaque", data=data),
            cluster_id,
            keep=keep,
        )
        with self._lock:
            self._tokens[cluster_id] = _decoded(made)


def _decoded(secret: dict[str, Any] | None) -> dict[str, str]:
    data = (secret or {}).get("data") or {}
    return {key: base64.b64decode(value).decode() for key, value in data.items()}
