"""The managed L2 tier of a cluster's KV cache on Kubernetes: a Valkey (Redis-compatible) Deployment with its
Service, a Secret holding its password and URL, and a NetworkPolicy that admits only the pods of that cluster's
model deployments. The deployments' pods read the URL from the Secret, mounted read-only at ``URL_FILE``: the
password is in no manifest and no Serve config."""

from __future__ import annotations

import base64
import secrets
from typing import Any

from raypod.backends.kuberay.objects import Objects, manifest

IMAGE = "valkey/valkey:8.1"
PORT = 6379
KV_DIR = "/raypod/kv"
URL_FILE = f"{KV_DIR}/url"
CLIENT_LABEL = "raypod.io/kv-client"  # on the pods that may reach a cluster's store: its name
NAME_LABEL = "app.kubernetes.io/name"


def store_name(cluster: str) -> str:
    return f"{cluster}-raypod-kv"


class KvStores:
    def __init__(self, objects: Objects, image: str = IMAGE) -> None:
        self.objects = objects
        self.image = image

    def ensure(self, cluster_id: str, namespace: str, cluster: str, max_bytes: int) -> str:
        """Create (or update) the cluster's store, evicting least recently used entries past ``max_bytes``;
        returns the URL file's path in the pods that mount it (``mount``). Raises TransientError, PermanentError."""
        name = store_name(cluster)
        password = secrets.token_urlsafe(32)

        def keep(current: dict[str, Any], desired: dict[str, Any]) -> dict[str, Any]:
            return {**desired, "data": current.get("data") or desired["data"]}  # the password stays

        url = f"redis://:{password}@{name}.{namespace}.svc:{PORT}/0"
        data = {key: base64.b64encode(value.encode()).decode() for key, value in (("password", password), ("url", url))}
        self.objects.ensure(manifest("Secret", namespace, name, type="Opaque", data=data), cluster_id, keep=keep)
        labels = {NAME_LABEL: name}
        container = {
            "name": "valkey",
            "image": self.image,
            "args": [
                "--requirepass",
                "$(VALKEY_PASSWORD)",
                "--maxmemory",
                str(max_bytes),
                "--maxmemory-policy",
                "allkeys-lru",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            "env": [{"name": "VALKEY_PASSWORD", "valueFrom": {"secretKeyRef": {"name": name, "key": "password"}}}],
            "ports": [{"containerPort": PORT, "name": "valkey"}],
            "resources": {"limits": {"memory": str(max_bytes + max_bytes // 4 + 64 * 2**20)}},
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        }
        pod = {
            "automountServiceAccountToken": False,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 999, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [container],
        }
        deployment = manifest(
            "Deployment",
            namespace,
            name,
            spec={
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": pod},
            },
        )
        self.objects.ensure(deployment, cluster_id)
        service = manifest(
            "Service", namespace, name, spec={"selector": labels, "ports": [{"name": "valkey", "port": PORT}]}
        )
        self.objects.ensure(service, cluster_id)
        policy = manifest(
            "NetworkPolicy",
            namespace,
            name,
            spec={
                "podSelector": {"matchLabels": labels},
                "policyTypes": ["Ingress"],
                "ingress": [
                    {
                        "from": [{"podSelector": {"matchLabels": {CLIENT_LABEL: cluster}}}],
                        "ports": [{"port": PORT, "protocol": "TCP"}],
                    }
                ],
            },
        )
        self.objects.ensure(policy, cluster_id)
        return URL_FILE

    def delete(self, cluster_id: str, namespace: str, cluster: str) -> None:
        for kind in ("NetworkPolicy", "Service", "Deployment", "Secret"):
            self.objects.delete(kind, namespace, store_name(cluster), cluster_id)


def mount(document: dict[str, Any], cluster: str) -> None:
    """Give every pod of a RayService (or RayCluster) manifest the store's URL file and the label the store's
    NetworkPolicy admits, in place."""
    body = document["spec"].get("rayClusterConfig", document["spec"])
    templates = [body["headGroupSpec"]["template"], *(g["template"] for g in body.get("workerGroupSpecs", []))]
    volume = {
        "name": "raypod-kv",
        "secret": {"secretName": store_name(cluster), "items": [{"key": "url", "path": "url"}], "defaultMode": 0o400},
    }
    for template in templates:
        template.setdefault("metadata", {}).setdefault("labels", {})[CLIENT_LABEL] = cluster
        pod = template["spec"]
        pod["volumes"] = [*pod.get("volumes", []), volume]
        ray = pod["containers"][0]
        ray["volumeMounts"] = [
            *ray.get("volumeMounts", []),
            {"name": "raypod-kv", "mountPath": KV_DIR, "readOnly": True},
        ]
