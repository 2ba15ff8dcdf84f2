"""Pure functions: ClusterSpec -> KubeRay ``ray.io/v1`` objects. Shared by ``--dry-run``, the API and the console."""

from __future__ import annotations

import json
from typing import Any

from raypod import spec as spec_mod

API_VERSION = "ray.io/v1"
DEFAULT_IMAGE = "rayproject/ray:{version}"


def raycluster(spec: spec_mod.ClusterSpec) -> dict[str, Any]:
    """Return the ``RayCluster`` that runs ``spec`` on Kubernetes."""
    metadata: dict[str, Any] = {
        "name": spec.name,
        "namespace": spec.namespace,
        "labels": {"app.kubernetes.io/managed-by": "raypod"},
    }
    if spec.owner:
        metadata["annotations"] = {"raypod.io/owner": spec.owner}
    if spec.runtime_env:
        metadata.setdefault("annotations", {})["raypod.io/default-runtime-env"] = json.dumps(
            spec.runtime_env, sort_keys=True
        )
    body: dict[str, Any] = {
        "rayVersion": spec.ray_version,
        "enableInTreeAutoscaling": any(
            g.effective_min_replicas != g.effective_max_replicas for g in spec.worker_groups
        ),
        "headGroupSpec": {
            "rayStartParams": _ray_start_params(spec.head, is_head=True),
            "template": _pod_template(spec, spec.head, "ray-head", head=True),
        },
        "workerGroupSpecs": [
            {
                "groupName": group.name,
                "replicas": group.replicas,
                "minReplicas": group.effective_min_replicas,
                "maxReplicas": group.effective_max_replicas,
                "rayStartParams": _ray_start_params(group, is_head=False),
                "template": _pod_template(spec, group, "ray-worker", head=False),
            }
            for group in spec.worker_groups
        ],
    }
    # KubeRay >= 1.5 takes node labels and custom resources as group fields and passes them to `ray start`.
    groups: list[spec_mod.NodeGroupSpec] = [spec.head, *spec.worker_groups]
    for group, manifest in zip(groups, [body["headGroupSpec"], *body["workerGroupSpecs"]], strict=True):
        if group.labels:
            manifest["labels"] = dict(group.labels)
        if group.resources:
            manifest["resources"] = {name: f"{amount:g}" for name, amount in sorted(group.resources.items())}
    if spec.gcs_fault_tolerance is not None:
        options: dict[str, Any] = {"redisAddress": spec.gcs_fault_tolerance.redis_address}
        if spec.gcs_fault_tolerance.external_storage_namespace:
            options["externalStorageNamespace"] = spec.gcs_fault_tolerance.external_storage_namespace
        body["gcsFaultToleranceOptions"] = options
    return {"apiVersion": API_VERSION, "kind": "RayCluster", "metadata": metadata, "spec": body}


def _ray_start_params(group: spec_mod.NodeGroupSpec, *, is_head: bool) -> dict[str, str]:
    params = {
        "num-cpus": str(group.cpus),
        "memory": str(group.memory),
        "object-store-memory": str(group.object_store_memory),
    }
    if group.gpus:
        params["num-gpus"] = str(group.gpus)
    if is_head:
        params["dashboard-host"] = "0.0.0.0"
    return params


def _pod_template(
    spec: spec_mod.ClusterSpec, group: spec_mod.NodeGroupSpec, container: str, *, head: bool
) -> dict[str, Any]:
    # Kubernetes memory must hold Ray's memory, the object store and the Ray processes themselves.
    overhead = 2 * 2**30 if head else 512 * 2**20
    limits: dict[str, str] = {
        "cpu": str(max(group.cpus, 1)),
        "memory": spec_mod.format_bytes(group.memory + group.object_store_memory + overhead),
    }
    if group.gpus:
        limits["nvidia.com/gpu"] = str(group.gpus)
    ports = (
        [
            {"containerPort": 6379, "name": "gcs-server"},
            {"containerPort": 8265, "name": "dashboard"},
            {"containerPort": 10001, "name": "client"},
        ]
        if head
        else []
    )
    main: dict[str, Any] = {
        "name": container,
        "image": spec.image or DEFAULT_IMAGE.format(version=spec.ray_version),
        "resources": {"limits": dict(limits), "requests": dict(limits)},
    }
    if spec.env:
        main["env"] = [{"name": key, "value": value} for key, value in sorted(spec.env.items())]
    if ports:
        main["ports"] = ports
    return {"spec": {"containers": [main]}}
