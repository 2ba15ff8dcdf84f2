"""raypod's quotas as Kueue objects, checked against Kueue's documented fields (v1beta1; its CRDs are not in any
package registry here, so the schemas below are written from its API reference, closed to other fields), and
RayClusters and RayJobs labelled for Kueue from the same spec."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from raypod import spec as spec_mod
from raypod.backends.kuberay import kueue, manifests

NAME = {
    "type": "object",
    "properties": {"name": {"type": "string"}},
    "required": ["name"],
    "additionalProperties": False,
}
NAMESPACED = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "namespace": {"type": "string"}},
    "required": ["name", "namespace"],
    "additionalProperties": False,
}
QUANTITY = {"type": "string", "pattern": r"^[0-9.]+([KMGTPE]i?|m)?$"}


def closed(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def top(kind: str, metadata: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    return closed(
        {"apiVersion": {"const": "kueue.x-k8s.io/v1beta1"}, "kind": {"const": kind}, "metadata": metadata, **body},
        ["apiVersion", "kind", "metadata"],
    )


RESOURCE = closed(
    {"name": {"type": "string"}, "nominalQuota": QUANTITY, "borrowingLimit": QUANTITY, "lendingLimit": QUANTITY},
    ["name", "nominalQuota"],
)
SCHEMAS = {
    "ResourceFlavor": top(
        "ResourceFlavor",
        NAME,
        {"spec": closed({"nodeLabels": {"type": "object"}, "tolerations": {"type": "array"}}, [])},
    ),
    "WorkloadPriorityClass": top(
        "WorkloadPriorityClass", NAME, {"value": {"type": "integer"}, "description": {"type": "string"}}
    ),
    "LocalQueue": top(
        "LocalQueue", NAMESPACED, {"spec": closed({"clusterQueue": {"type": "string"}}, ["clusterQueue"])}
    ),
    "ClusterQueue": top(
        "ClusterQueue",
        NAME,
        {
            "spec": closed(
                {
                    "cohort": {"type": "string"},
                    "namespaceSelector": {"type": "object"},
                    "queueingStrategy": {"enum": ["StrictFIFO", "BestEffortFIFO"]},
                    "preemption": closed(
                        {
                            "reclaimWithinCohort": {"enum": ["Never", "LowerPriority", "Any"]},
                            "withinClusterQueue": {"enum": ["Never", "LowerPriority", "LowerOrNewerEqualPriority"]},
                        },
                        [],
                    ),
                    "resourceGroups": {
                        "type": "array",
                        "items": closed(
                            {
                                "coveredResources": {"type": "array", "items": {"type": "string"}},
                                "flavors": {
                                    "type": "array",
                                    "items": closed(
                                        {"name": {"type": "string"}, "resources": {"type": "array", "items": RESOURCE}},
                                        ["name", "resources"],
                                    ),
                                },
                            },
                            ["coveredResources", "flavors"],
                        ),
                    },
                },
                ["resourceGroups"],
            )
        },
    ),
}
QUOTAS = {
    "ml": spec_mod.QuotaSpec(cpus=16, memory="64Gi", gpus=2, nodes=20, borrow=True),
    "web": spec_mod.QuotaSpec(cpus=4, policy="reject"),
}
NAMESPACES = {"ml": "ml", "ml-dev": "ml", "web": "web", "orphan": "nobody"}


def test_every_object_has_only_kueues_documented_fields() -> None:
    objects = kueue.objects(QUOTAS, NAMESPACES, {"low": 0, "normal": 100, "high": 1000})
    kinds = [o["kind"] for o in objects]
    assert kinds.count("ClusterQueue") == 2 and kinds.count("LocalQueue") == 3 and kinds.count("ResourceFlavor") == 1
    assert kinds.count("WorkloadPriorityClass") == 3
    for item in objects:
        jsonschema.validate(item, SCHEMAS[item["kind"]])


def test_quotas_map_onto_nominal_quotas_and_borrowing_onto_the_cohort() -> None:
    queues = {
        o["metadata"]["name"]: o
        for o in kueue.objects(QUOTAS, NAMESPACES, {"normal": 100})
        if o["kind"] == "ClusterQueue"
    }
    ml = queues["ml"]["spec"]
    [flavor] = ml["resourceGroups"][0]["flavors"]
    assert {r["name"]: r["nominalQuota"] for r in flavor["resources"]} == {
        "cpu": "16",
        "memory": "64Gi",
        "nvidia.com/gpu": "2",
        "pods": "20",
    }
    assert all("borrowingLimit" not in r for r in flavor["resources"]), "ml may borrow"
    assert ml["namespaceSelector"]["matchExpressions"][0]["values"] == ["ml", "ml-dev"]
    [web_flavor] = queues["web"]["spec"]["resourceGroups"][0]["flavors"]
    assert web_flavor["resources"] == [{"name": "cpu", "nominalQuota": "4", "borrowingLimit": "0"}]


@pytest.mark.parametrize("priority", ["normal", "high"])
def test_rayclusters_and_rayjobs_carry_kueues_labels_and_read_back(priority: str) -> None:
    spec = spec_mod.parse_spec({"name": "demo", "namespace": "ml", "priority": priority})
    cluster = manifests.raycluster(spec, kueue=True)
    assert cluster["metadata"]["labels"][manifests.KUEUE_QUEUE_LABEL] == "raypod"
    assert cluster["metadata"]["labels"][manifests.KUEUE_PRIORITY_LABEL] == priority
    assert manifests.spec_from_raycluster(cluster).priority == priority
    assert manifests.spec_from_raycluster(manifests.raycluster(spec)).priority == priority
    job = manifests.rayjob(
        spec,
        "rj-1",
        entrypoint="python x.py",
        runtime_env={},
        max_retries=0,
        shutdown_after_finish=True,
        metadata={},
        kueue=True,
    )
    assert job["metadata"]["labels"][manifests.KUEUE_PRIORITY_LABEL] == priority
    assert manifests.KUEUE_QUEUE_LABEL not in manifests.raycluster(spec)["metadata"]["labels"]
