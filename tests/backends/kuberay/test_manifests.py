"""Generated RayCluster manifests validate against KubeRay v1.7.0's CRD schema (kept in the repository)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from raypod import errors
from raypod import spec as spec_mod
from raypod.backends.kuberay import manifests


def crd_schema(path: Path) -> dict[str, Any]:
    """The v1 openAPIV3Schema of a KubeRay CRD file."""
    crd = yaml.safe_load(path.read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


@pytest.fixture(scope="module")
def raycluster_schema(kuberay_crds: Path) -> dict[str, Any]:
    return crd_schema(kuberay_crds / "ray.io_rayclusters.yaml")


SPECS = [
    {"name": "small"},
    {"name": "demo", "worker_groups": [{"name": "cpu", "replicas": 2}]},
    {
        "name": "full",
        "namespace": "team-a",
        "owner": "alice",
        "image": "example.org/ray:custom",
        "head": {"cpus": 2, "memory": "4Gi", "labels": {"zone": "a"}},
        "worker_groups": [
            {"name": "cpu", "replicas": 1, "min_replicas": 0, "max_replicas": 5, "resources": {"disk": 2}},
            {"name": "gpu", "replicas": 1, "gpus": 2, "labels": {"accelerator": "h100"}},
        ],
        "env": {"A": "1"},
        "runtime_env": {"pip": ["requests"]},
        "gcs_fault_tolerance": {"redis_address": "redis:6379", "external_storage_namespace": "full"},
    },
]


@pytest.mark.parametrize("data", SPECS, ids=[s["name"] for s in SPECS])
def test_manifest_validates_against_the_crd(data: dict[str, Any], raycluster_schema: dict[str, Any]) -> None:
    manifest = manifests.raycluster(spec_mod.parse_spec(data))
    jsonschema.validate(manifest["spec"], raycluster_schema["properties"]["spec"])
    assert manifest["apiVersion"] == "ray.io/v1" and manifest["kind"] == "RayCluster"


def test_schema_check_is_strict_enough_to_catch_a_broken_manifest(raycluster_schema: dict[str, Any]) -> None:
    manifest = manifests.raycluster(spec_mod.parse_spec(SPECS[1]))
    del manifest["spec"]["workerGroupSpecs"][0]["groupName"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(manifest["spec"], raycluster_schema["properties"]["spec"])


def test_manifest_carries_the_spec() -> None:
    manifest = manifests.raycluster(spec_mod.parse_spec(SPECS[2]))
    body = manifest["spec"]
    assert manifest["metadata"]["namespace"] == "team-a"
    assert body["enableInTreeAutoscaling"] is True
    cpu, gpu = body["workerGroupSpecs"]
    assert (cpu["minReplicas"], cpu["replicas"], cpu["maxReplicas"]) == (0, 1, 5)
    assert cpu["resources"] == {"disk": "2"}
    assert gpu["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert gpu["labels"] == {"accelerator": "h100"}
    assert body["gcsFaultToleranceOptions"]["redisAddress"] == "redis:6379"
    assert body["headGroupSpec"]["template"]["spec"]["containers"][0]["image"] == "example.org/ray:custom"


def test_fixed_size_groups_do_not_enable_the_autoscaler() -> None:
    manifest = manifests.raycluster(spec_mod.parse_spec(SPECS[1]))
    assert manifest["spec"]["enableInTreeAutoscaling"] is False


@pytest.mark.parametrize("data", SPECS, ids=[s["name"] for s in SPECS])
def test_every_field_raypod_emits_is_defined_by_kuberay_1_7(
    data: dict[str, Any], raycluster_schema: dict[str, Any]
) -> None:
    manifest = manifests.raycluster(spec_mod.parse_spec(data))
    assert manifests.unknown_fields(manifest["spec"], raycluster_schema["properties"]["spec"]) == []


def test_a_field_an_older_kuberay_lacks_is_named(raycluster_schema: dict[str, Any]) -> None:
    older = copy.deepcopy(raycluster_schema["properties"]["spec"])
    del older["properties"]["workerGroupSpecs"]["items"]["properties"]["labels"]  # added in KubeRay 1.5
    manifest = manifests.raycluster(spec_mod.parse_spec(SPECS[2]))
    assert manifests.unknown_fields(manifest["spec"], older) == ["workerGroupSpecs[1].labels"]


@pytest.fixture(scope="module")
def rayjob_schema(kuberay_crds: Path) -> dict[str, Any]:
    return crd_schema(kuberay_crds / "ray.io_rayjobs.yaml")


@pytest.mark.parametrize("data", SPECS, ids=[s["name"] for s in SPECS])
@pytest.mark.parametrize("shutdown", [True, False])
def test_a_rayjob_validates_against_kuberay_1_7(
    data: dict[str, Any], shutdown: bool, rayjob_schema: dict[str, Any]
) -> None:
    spec = spec_mod.parse_spec(data)
    manifest = manifests.rayjob(
        spec,
        "rj-0123456789",
        entrypoint="python train.py",
        runtime_env={"pip": ["requests"], "env_vars": {"A": "1"}},
        max_retries=2,
        shutdown_after_finish=shutdown,
        metadata={"raypod_job": "rj-0123456789"},
    )
    jsonschema.validate(manifest["spec"], rayjob_schema["properties"]["spec"])
    assert manifests.unknown_fields(manifest["spec"], rayjob_schema["properties"]["spec"]) == []
    assert manifest["spec"]["backoffLimit"] == 2
    assert manifest["spec"]["shutdownAfterJobFinishes"] is shutdown
    assert manifest["spec"]["rayClusterSpec"] == {
        **manifests.raycluster(spec)["spec"],
        "authOptions": {"mode": "token"},
    }
    assert yaml.safe_load(manifest["spec"]["runtimeEnvYAML"]) == {"pip": ["requests"], "env_vars": {"A": "1"}}


@pytest.fixture(scope="module")
def rayservice_schema(kuberay_crds: Path) -> dict[str, Any]:
    return crd_schema(kuberay_crds / "ray.io_rayservices.yaml")


@pytest.mark.parametrize("data", SPECS, ids=[s["name"] for s in SPECS])
def test_a_rayservice_validates_against_kuberay_1_7(data: dict[str, Any], rayservice_schema: dict[str, Any]) -> None:
    spec = spec_mod.parse_spec(data)
    args = {"action": "deploy", "name": "llama", "engine": "cpu", "options": {"num_replicas": 2}}
    manifest = manifests.rayservice(spec, "llama", args)
    jsonschema.validate(manifest["spec"], rayservice_schema["properties"]["spec"])
    assert manifests.unknown_fields(manifest["spec"], rayservice_schema["properties"]["spec"]) == []
    assert manifest["kind"] == "RayService" and manifest["metadata"]["name"] == f"{spec.name}-llama"
    assert manifest["spec"]["rayClusterConfig"] == {
        **manifests.raycluster(spec)["spec"],
        "authOptions": {"mode": "token"},
    }
    [app] = yaml.safe_load(manifest["spec"]["serveConfigV2"])["applications"]
    assert app == {
        "name": "llama",
        "route_prefix": "/llama",
        "import_path": "raypod.serving.deploy:build",
        "args": args,
    }


def test_a_rayservice_name_stays_short_enough_for_kuberays_derived_names() -> None:
    long_cluster, long_app = "c" * 63, "a" * 40
    name = manifests.rayservice_name(long_cluster, long_app)
    assert len(name) <= 40 and name != manifests.rayservice_name(long_cluster, "a" * 39)
    assert len(f"{name}-abcde-head-svc") <= 63


def test_a_manifest_with_every_add_on_validates_and_reads_back_to_its_spec(
    raycluster_schema: dict[str, Any], tmp_path: Path
) -> None:
    """Hang detection's agent (with its report credential), a workspace's IDE and health checks, as the server
    applies them: valid for KubeRay 1.7, no field it would drop, and read back to the same spec."""
    from raypod.controlplane.addons import NodeAddonMaker
    from raypod.controlplane.hangwatch import AgentReports

    spec = spec_mod.parse_spec(
        {
            "name": "full",
            "owner": "ana",
            "env": {"RAY_TRAIN_CALLBACKS": "my.Callback"},
            "worker_groups": [{"name": "cpu", "replicas": 2}],
            "health_checks": [{"name": "disk", "command": "test -w /tmp"}],
            "spaces": [{"name": "nb", "owner": "ana"}, {"name": "ed", "owner": "ana", "kind": "code-editor"}],
        }
    )
    maker = NodeAddonMaker(tmp_path, AgentReports(tmp_path), "https://raypod.example", b"a CA")
    manifest = manifests.raycluster(spec, node_addons=lambda node: maker("uid-1", node))
    jsonschema.validate(manifest["spec"], raycluster_schema["properties"]["spec"])
    assert manifests.unknown_fields(manifest["spec"], raycluster_schema["properties"]["spec"]) == []
    cpu = next(g for g in manifest["spec"]["workerGroupSpecs"] if g["groupName"] == "cpu")
    ray_env = {e["name"]: e.get("value") for e in cpu["template"]["spec"]["containers"][0]["env"]}
    assert ray_env["RAY_TRAIN_CALLBACKS"].startswith("my.Callback,"), "the user's callbacks stay, the agent's join"
    assert manifests.spec_from_raycluster(manifest) == spec, "reading it back loses what raypod added, nothing else"


def test_the_objects_beside_a_raycluster_are_valid_kubernetes_objects(tmp_path: Path) -> None:
    """What AddonObjects and KvStores write, read back through the Kubernetes client's typed models."""
    from kubernetes import client

    from raypod.backends.kuberay import kvstore
    from raypod.backends.kuberay.sidecars import AddonObjects
    from raypod.controlplane.addons import NodeAddonMaker

    written: list[dict[str, Any]] = []

    class Recording:
        def ensure(self, manifest: dict[str, Any], owner: str | None, **_: Any) -> dict[str, Any]:
            written.append(manifest)
            return manifest

        def delete(self, *args: Any) -> None:
            pass

    spec = spec_mod.parse_spec({"name": "full", "owner": "ana", "spaces": [{"name": "nb", "owner": "ana"}]})
    maker = NodeAddonMaker(tmp_path)
    per_group = {group: maker("uid-1", node) for group, node in spec.group_nodes().items()}
    AddonObjects(Recording()).apply("uid-1", spec, per_group)  # type: ignore[arg-type]
    kvstore.KvStores(Recording()).ensure("uid-1", "default", "full", 2**30)  # type: ignore[arg-type]
    api = client.ApiClient()
    kinds = {doc["kind"] for doc in written}
    assert kinds == {"ConfigMap", "Secret", "PersistentVolumeClaim", "Service", "Deployment", "NetworkPolicy"}
    for doc in written:
        model = api._ApiClient__deserialize(doc, f"V1{doc['kind']}")  # type: ignore[attr-defined]
        assert api.sanitize_for_serialization(model) == doc, f"{doc['kind']}: a field Kubernetes does not know"


def test_autoscaling_becomes_kuberays_autoscaler_options_and_reads_back(raycluster_schema: dict[str, Any]) -> None:
    spec = spec_mod.parse_spec(
        {
            "name": "elastic",
            "worker_groups": [{"name": "cpu", "replicas": 1, "min_replicas": 1, "max_replicas": 4}],
            "autoscaling": {"idle_timeout_s": 30, "upscaling": "Aggressive"},
        }
    )
    manifest = manifests.raycluster(spec)
    assert manifest["spec"]["enableInTreeAutoscaling"] is True
    assert manifest["spec"]["autoscalerOptions"] == {"idleTimeoutSeconds": 30, "upscalingMode": "Aggressive"}
    jsonschema.validate(manifest["spec"], raycluster_schema["properties"]["spec"])
    assert manifests.spec_from_raycluster(manifest) == spec
    edited = copy.deepcopy(manifest)
    edited["spec"]["autoscalerOptions"]["image"] = "mine"
    with pytest.raises(errors.InvalidSpec, match=r"autoscalerOptions\.image"):
        manifests.spec_from_raycluster(edited)


def test_autoscaling_without_a_group_that_may_change_size_is_refused() -> None:
    with pytest.raises(errors.InvalidSpec, match="no worker group may grow or shrink"):
        spec_mod.parse_spec({"name": "fixed", "worker_groups": [{"name": "cpu"}], "autoscaling": {}})
