"""The plain Kubernetes objects raypod keeps beside a RayCluster (ConfigMaps, Secrets, Services, claims, the
managed Redis' Deployment and NetworkPolicy): created when missing, replaced when raypod's manifest of them
changed, deleted with what they serve, and never touched when raypod did not make them."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from raypod import errors
from raypod.backends.kuberay import api_errors

MANAGED_BY = {"app.kubernetes.io/managed-by": "raypod"}
OWNER_LABEL = "raypod.io/cluster-uid"
DIGEST_ANNOTATION = "raypod.io/manifest-digest"

# kind -> (API class, the name the client gives its methods: read_namespaced_<name>, ...)
_KINDS: dict[str, tuple[type, str]] = {
    "ConfigMap": (client.CoreV1Api, "config_map"),
    "Secret": (client.CoreV1Api, "secret"),
    "Service": (client.CoreV1Api, "service"),
    "PersistentVolumeClaim": (client.CoreV1Api, "persistent_volume_claim"),
    "Deployment": (client.AppsV1Api, "deployment"),
    "NetworkPolicy": (client.NetworkingV1Api, "network_policy"),
}


def manifest(kind: str, namespace: str, name: str, **body: Any) -> dict[str, Any]:
    """A new object of one of the kinds raypod keeps (``body``: its fields beside metadata)."""
    api_version = {"Deployment": "apps/v1", "NetworkPolicy": "networking.k8s.io/v1"}.get(kind, "v1")
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "namespace": namespace}, **body}


class Objects:
    def __init__(self, api: client.ApiClient, request_timeout_s: float) -> None:
        self._apis = {kind: (cls(api), suffix) for kind, (cls, suffix) in _KINDS.items()}
        self._serialize = api.sanitize_for_serialization
        self._timeout = request_timeout_s

    def read(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The object as a dict; None where there is none. Raises TransientError, PermanentError."""
        try:
            found = self._method(kind, "read")(name, namespace, _request_timeout=self._timeout)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise api_errors.to_raypod(exc, f"read {kind} {namespace}/{name}") from None
        except Exception as exc:
            raise api_errors.to_raypod(exc, f"read {kind} {namespace}/{name}") from None
        result: dict[str, Any] = self._serialize(found)  # type: ignore[no-untyped-call]
        return result

    def ensure(
        self,
        manifest: dict[str, Any],
        owner: str | None,
        *,
        keep: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]] | None = None,
        update: bool = True,
    ) -> dict[str, Any]:
        """Make the object ``manifest`` describes exist as described; ``owner``: the cluster uid it belongs to
        (None: any of raypod's clusters may share it, as a workspace's files). ``keep(current, desired)`` may carry
        what must survive an update (a Secret's generated values); ``update=False`` leaves an existing object as it
        is (a claim, whose spec is immutable). Returns the object as it now is.

        Raises:
            PermanentError: an object of that name exists that raypod did not make (for ``owner``); RBAC.
            TransientError: the API server cannot be reached, or the object changed meanwhile (next pass).
        """
        kind = manifest["kind"]
        metadata = manifest["metadata"]
        namespace, name = metadata["namespace"], metadata["name"]
        labels = {**MANAGED_BY, **metadata.get("labels", {}), **({OWNER_LABEL: owner} if owner else {})}
        metadata["labels"] = labels
        current = self.read(kind, namespace, name)
        if current is not None:
            current_labels = (current.get("metadata") or {}).get("labels") or {}
            if current_labels.get("app.kubernetes.io/managed-by") != "raypod" or (
                owner and current_labels.get(OWNER_LABEL) != owner
            ):
                raise errors.PermanentError(
                    f"a {kind} {name} in namespace {namespace} exists that raypod did not create for this cluster; "
                    "delete it or choose another name"
                )
            if not update:
                return current
            if keep is not None:
                manifest = keep(current, manifest)
        digest = hashlib.sha256(json.dumps(manifest, sort_keys=True, default=str).encode()).hexdigest()[:16]
        manifest["metadata"].setdefault("annotations", {})[DIGEST_ANNOTATION] = digest
        if current is None:
            return self._write(kind, "create", namespace, name, manifest)
        if ((current.get("metadata") or {}).get("annotations") or {}).get(DIGEST_ANNOTATION) == digest:
            return current
        body = {key: value for key, value in manifest.items() if key not in ("apiVersion", "kind", "metadata")}
        patch = merge_patch({key: current.get(key) for key in body}, body) or {}
        patch["metadata"] = {
            "labels": manifest["metadata"]["labels"],
            "annotations": manifest["metadata"]["annotations"],
            "resourceVersion": current["metadata"].get("resourceVersion"),  # 409 if it changed since it was read
        }
        return self._write(kind, "patch", namespace, name, patch)

    def delete(self, kind: str, namespace: str, name: str, owner: str | None) -> None:
        """Delete the object if raypod made it (for ``owner``, when given); nothing where there is none."""
        current = self.read(kind, namespace, name)
        if current is None:
            return
        labels = (current.get("metadata") or {}).get("labels") or {}
        if labels.get("app.kubernetes.io/managed-by") != "raypod" or (owner and labels.get(OWNER_LABEL) != owner):
            return
        try:
            self._method(kind, "delete")(name, namespace, _request_timeout=self._timeout)
        except ApiException as exc:
            if exc.status != 404:
                raise api_errors.to_raypod(exc, f"delete {kind} {namespace}/{name}") from None
        except Exception as exc:
            raise api_errors.to_raypod(exc, f"delete {kind} {namespace}/{name}") from None

    def _write(self, kind: str, verb: str, namespace: str, name: str, manifest: dict[str, Any]) -> dict[str, Any]:
        try:
            if verb == "create":
                found = self._method(kind, verb)(namespace, manifest, _request_timeout=self._timeout)
            else:
                found = self._method(kind, verb)(
                    name,
                    namespace,
                    manifest,
                    _request_timeout=self._timeout,
                    _content_type="application/merge-patch+json",
                )
        except ApiException as exc:
            if exc.status == 409:
                raise errors.TransientError(f"{verb} {kind} {namespace}/{name}: it changed meanwhile") from None
            raise api_errors.to_raypod(exc, f"{verb} {kind} {namespace}/{name}") from None
        except Exception as exc:
            raise api_errors.to_raypod(exc, f"{verb} {kind} {namespace}/{name}") from None
        result: dict[str, Any] = self._serialize(found)  # type: ignore[no-untyped-call]
        return result

    def _method(self, kind: str, verb: str) -> Any:
        api, suffix = self._apis[kind]
        return getattr(api, f"{verb}_namespaced_{suffix}")


def merge_patch(current: Any, desired: Any) -> Any:
    """The JSON merge patch (RFC 7386) that turns ``current`` into ``desired``: keys ``desired`` lacks are nulled."""
    if not isinstance(current, dict) or not isinstance(desired, dict):
        return desired
    patch = {key: None for key in current if key not in desired}
    for key, value in desired.items():
        if key not in current or current[key] != value:
            patch[key] = merge_patch(current.get(key), value)
    return patch
