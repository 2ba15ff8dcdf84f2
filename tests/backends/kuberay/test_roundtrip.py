"""RayCluster manifests read back into the spec they came from; edits raypod cannot keep are refused."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from raypod import errors
from raypod import spec as spec_mod
from raypod.backends.kuberay import manifests
from tests.backends.kuberay.test_manifests import SPECS


@pytest.mark.parametrize("data", SPECS, ids=lambda d: d["name"])
def test_spec_survives_a_round_trip_through_yaml(data: dict[str, Any]) -> None:
    original = spec_mod.parse_spec(data)
    text = yaml.safe_dump(manifests.raycluster(original))
    assert manifests.spec_from_raycluster(yaml.safe_load(text)) == original


def test_an_edited_manifest_changes_the_spec() -> None:
    manifest = manifests.raycluster(spec_mod.parse_spec(SPECS[1]))
    manifest["spec"]["workerGroupSpecs"][0]["replicas"] = 3
    manifest["spec"]["workerGroupSpecs"][0]["maxReplicas"] = 3
    manifest["spec"]["headGroupSpec"]["rayStartParams"]["memory"] = "3Gi"
    manifest["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"] = [{"name": "X", "value": "y"}]
    for group in manifest["spec"]["workerGroupSpecs"]:
        group["template"]["spec"]["containers"][0]["env"] = [{"name": "X", "value": "y"}]
    spec = manifests.spec_from_raycluster(manifest)
    assert spec.worker_groups[0].replicas == 3
    assert spec.head.memory == 3 * 2**30
    assert spec.env == {"X": "y"}


def _edit(path: str, value: Any) -> dict[str, Any]:
    manifest = copy.deepcopy(manifests.raycluster(spec_mod.parse_spec(SPECS[2])))
    target = manifest
    *parents, last = path.split("/")
    for part in parents:
        target = target[int(part)] if isinstance(target, list) else target[part]
    target[last] = value
    return manifest


@pytest.mark.parametrize(
    ("manifest", "field"),
    [
        ("not a mapping", "manifest"),
        ({"apiVersion": "v1", "kind": "Pod"}, "kind RayCluster"),
        (_edit("spec/headGroupSpec/template/spec/tolerations", []), "spec.headGroupSpec.template.spec.tolerations"),
        (_edit("spec/suspend", True), "spec.suspend"),
        (_edit("metadata/labels/team", "a"), "metadata.labels.team"),
        (_edit("spec/workerGroupSpecs/0/rayStartParams/block", "true"), "rayStartParams.block"),
        (_edit("spec/workerGroupSpecs/0/replicas", 9), "replicas"),
        (_edit("spec/workerGroupSpecs/0/groupName", "Bad_Name"), "worker_groups.0.name"),
        (_edit("spec/headGroupSpec/rayStartParams/memory", "lots"), "head.memory"),
        (_edit("spec/workerGroupSpecs", {"a": 1}), "spec.workerGroupSpecs: expected a list"),
        (_edit("metadata/annotations/raypod.io~1owner", "x"), "metadata.annotations"),
        (_edit("spec/workerGroupSpecs/1/template/spec/containers/0/image", "other"), "shares the head's image"),
    ],
)
def test_manifests_raypod_cannot_represent_are_refused_by_field(manifest: Any, field: str) -> None:
    with pytest.raises(errors.InvalidSpec) as caught:
        manifests.spec_from_raycluster(manifest)
    assert field in caught.value.message


def test_hang_detection_settings_travel_in_an_annotation() -> None:
    data = {
        **SPECS[1],
        "hangwatch": {
            "timeout": "15m",
            "action": "cancel",
            "rules": [
                {"name": "oom", "type": "log_pattern", "log_pattern": "CUDA out of memory", "fault_on_match": True}
            ],
        },
    }
    original = spec_mod.parse_spec(data)
    manifest = yaml.safe_load(yaml.safe_dump(manifests.raycluster(original)))
    assert '"action": "cancel"' in manifest["metadata"]["annotations"]["raypod.io/hangwatch"]
    read = manifests.spec_from_raycluster(manifest)
    assert read.hangwatch == original.hangwatch and read.hangwatch.timeout == 900
    assert "raypod.io/hangwatch" not in manifests.raycluster(spec_mod.parse_spec(SPECS[1]))["metadata"].get(
        "annotations", {}
    ), "defaults need no annotation"
    manifest["metadata"]["annotations"]["raypod.io/hangwatch"] = '{"action": "explode"}'
    with pytest.raises(errors.InvalidSpec, match=r"hangwatch\.action"):
        manifests.spec_from_raycluster(manifest)
