"""Each cluster's Ray token, kept in a Secret of its namespace that raypod creates (and alone deletes): KubeRay's
pods read it, raypod's gateway presents it."""

from __future__ import annotations

import base64
import secrets
import threading

from raypod import errors
from raypod.backends.kuberay import manifests
from raypod.backends.kuberay.informer import Key
from raypod.backends.kuberay.objects import OWNER_LABEL, Objects, manifest

UID_LABEL = OWNER_LABEL


class RayTokens:
    def __init__(self, objects: Objects) -> None:
        self.objects = objects
        self._lock = threading.Lock()
        self._ray_tokens: dict[str, str] = {}  # cluster uid -> its Ray token (from its Secret)

    def get(self, cluster_id: str, where: Key) -> str:
        """The cluster's Ray token: read from its Secret, which is created with a new token when missing. A Secret
        of that name that raypod did not make for this cluster is never used.

        Raises TransientError, PermanentError (a Secret of that name that is not this cluster's)."""
        with self._lock:
            token = self._ray_tokens.get(cluster_id)
        if token is not None:
            return token
        namespace, name = where[0], manifests.auth_secret_name(where[1])
        fresh = base64.b64encode(secrets.token_urlsafe(32).encode()).decode()
        made = self.objects.ensure(
            manifest("Secret", namespace, name, type="Opaque", data={"auth_token": fresh}),
            cluster_id,
            keep=lambda current, desired: {**desired, "data": current.get("data") or desired["data"]},
        )
        data = made.get("data") or {}
        if "auth_token" not in data:
            raise errors.PermanentError(f"the Secret {namespace}/{name} holds no auth_token: delete it")
        token = base64.b64decode(data["auth_token"]).decode()
        with self._lock:
            self._ray_tokens[cluster_id] = token
        return token

    def delete(self, cluster_id: str, where: Key) -> None:
        """Delete the cluster's token Secret, if it is the one raypod made for it."""
        with self._lock:
            self._ray_tokens.pop(cluster_id, None)
        self.objects.delete("Secret", where[0], manifests.auth_secret_name(where[1]), cluster_id)
