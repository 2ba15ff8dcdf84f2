"""raypod's quotas and priority classes as Kueue objects, for administrators who run Kueue on Kubernetes and want one
source of truth: a ``ResourceFlavor``, a ``ClusterQueue`` per team (its namespaces, its quota, one cohort so idle
quota can be lent), a ``LocalQueue`` per namespace, and a ``WorkloadPriorityClass`` per priority class. Pure.

raypod's CPU quota is Ray's CPUs, and a pod requests at least one CPU per node (``manifests``), so the two agree for
whole-CPU nodes; memory is Ray memory plus object store, and each pod asks a little more for Ray's processes.
"""

from __future__ import annotations

from typing import Any

from raypod import spec as spec_mod
from raypod.backends.kuberay import manifests

API_VERSION = "kueue.x-k8s.io/v1beta1"
FLAVOR = "raypod-default"
COHORT = "raypod"


def objects(
    quotas: dict[str, spec_mod.QuotaSpec], namespaces: dict[str, str], priority_classes: dict[str, int]
) -> list[dict[str, Any]]:
    """Every Kueue object for these quotas (team -> quota), namespaces (namespace -> team) and priority classes."""
    found: list[dict[str, Any]] = [
        {"apiVersion": API_VERSION, "kind": "ResourceFlavor", "metadata": {"name": FLAVOR}, "spec": {}}
    ]
    for name, value in sorted(priority_classes.items(), key=lambda item: item[1]):
        found.append(
            {
                "apiVersion": API_VERSION,
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": name},
                "value": value,
                "description": f"raypod priority class {name}",
            }
        )
    for team, quota in sorted(quotas.items()):
        members = sorted(ns for ns, owner in namespaces.items() if owner == team)
        found.append(_cluster_queue(team, quota, members))
        for namespace in members:
            found.append(
                {
                    "apiVersion": API_VERSION,
                    "kind": "LocalQueue",
                    "metadata": {"name": manifests.KUEUE_LOCAL_QUEUE, "namespace": namespace},
                    "spec": {"clusterQueue": team},
                }
            )
    return found


def _cluster_queue(team: str, quota: spec_mod.QuotaSpec, namespaces: list[str]) -> dict[str, Any]:
    resources = []
    limits = (("cpu", quota.cpus), ("memory", quota.memory), ("nvidia.com/gpu", quota.gpus), ("pods", quota.nodes))
    for name, amount in limits:
        if amount is None:
            continue
        entry: dict[str, Any] = {"name": name, "nominalQuota": _quantity(name, amount)}
        if not quota.borrow:
            entry["borrowingLimit"] = "0"
        resources.append(entry)
    return {
        "apiVersion": API_VERSION,
        "kind": "ClusterQueue",
        "metadata": {"name": team},
        "spec": {
            "cohort": COHORT,
            "namespaceSelector": {
                "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": namespaces}]
            },
            "queueingStrategy": "BestEffortFIFO",
            "preemption": {
                "reclaimWithinCohort": "Any",  # a lender gets its quota back from borrowers
                "withinClusterQueue": "LowerPriority",
            },
            "resourceGroups": [_resource_group(resources)] if resources else [],
        },
    }


def _quantity(name: str, amount: float) -> str:
    if name == "memory":
        return spec_mod.format_bytes(int(amount))
    return f"{amount:g}"


def _resource_group(resources: list[dict[str, Any]]) -> dict[str, Any]:
    return {"coveredResources": [r["name"] for r in resources], "flavors": [{"name": FLAVOR, "resources": resources}]}
