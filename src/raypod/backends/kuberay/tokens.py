"""Each cluster's Ray token, kept in a Secret of its namespace that raypod creates (and alone deletes): KubeRay's
pods read it, raypod's gateway presents it."""

from __future__ import annotations

import base64
import secrets
import threading
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from raypod import errors
from raypod.backends.kuberay import api_errors, manifests
from raypod.backends.kuberay.informer import Key

UID_LABEL = "raypod.io/cluster-uid"


class RayTokens:
    def __init__(self, core: client.CoreV1Api, request_timeout_s: float, call: Callable[..., Any]) -> None:
        self._core = core
        self._timeout = request_timeout_s
        self._call = call
        self._lock = threading.Lock()
        self._ray_tokens: dict[str, str] = {}  # cluster uid -> its Ray token (from its Secret)

    def get(self, cluster_id: str, where: Key) -> str:
        """The cluster's Ray token: read from its Secret, which is created with a new token when missing. A Secret
        of that name that raypod did not make for this cluster is never used."""
        with self._lock:
            token = self._ray_tokens.get(cluster_id)
        if token is not None:
            return token
        namespace, name = where[0], manifests.auth_secret_name(where[1])
        secret = self._read_secret(namespace, name)
        if secret is None:
            token = secrets.token_urlsafe(32)
            body = client.V1Secret(
                metadata=client.V1ObjectMeta(
                    name=name,
                    namespace=namespace,
                    labels={"app.kubernetes.io/managed-by": "raypod", UID_LABEL: cluster_id},
                ),
                type="Opaque",
                data={"auth_token": base64.b64encode(token.encode()).decode()},
            )
            try:
                self._core.create_namespaced_secret(namespace, body, _request_timeout=self._timeout)
            except Exception as exc:  # 409 too: made meanwhile, and read next time
                raise api_errors.to_raypod(exc, f"create Secret {namespace}/{name}") from None
        else:
            data = secret.data or {}
            if not _is_ours(secret, cluster_id) or "auth_token" not in data:
                raise errors.PermanentError(
                    f"a Secret {name} in namespace {namespace} exists that raypod did not create for this cluster; "
                    "delete it or choose another cluster name"
                )
            token = base64.b64decode(data["auth_token"]).decode()
        with self._lock:
            self._ray_tokens[cluster_id] = token
        return token

    def delete(self, cluster_id: str, where: Key) -> None:
        """Delete the cluster's token Secret, if it is the one raypod made for it."""
        with self._lock:
            self._ray_tokens.pop(cluster_id, None)
        namespace, name = where[0], manifests.auth_secret_name(where[1])
        secret = self._read_secret(namespace, name)
        if secret is not None and _is_ours(secret, cluster_id):
            self._call(
                f"delete Secret {namespace}/{name}",
                self._core.delete_namespaced_secret,
                name,
                namespace,
                _request_timeout=self._timeout,
            )

    def _read_secret(self, namespace: str, name: str) -> client.V1Secret | None:
        """None where there is none. Raises TransientError, PermanentError."""
        try:
            return self._core.read_namespaced_secret(name, namespace, _request_timeout=self._timeout)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise api_errors.to_raypod(exc, f"read Secret {namespace}/{name}") from None
        except Exception as exc:
            raise api_errors.to_raypod(exc, f"read Secret {namespace}/{name}") from None


def _is_ours(secret: client.V1Secret, cluster_id: str) -> bool:
    labels = (secret.metadata.labels if secret.metadata is not None else None) or {}
    return bool(labels.get(UID_LABEL) == cluster_id)
