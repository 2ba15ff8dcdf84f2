from __future__ import annotations

import pytest

from raypod import errors
from raypod import spec as spec_mod


def make(**overrides: object) -> spec_mod.ClusterSpec:
    data: dict[str, object] = {"name": "demo", "worker_groups": [{"name": "cpu", "replicas": 2}]}
    data.update(overrides)
    return spec_mod.parse_spec(data)


def test_defaults_describe_a_small_fixed_size_cluster() -> None:
    spec = make()
    assert spec.namespace == "default"
    assert spec.ray_version == spec_mod.DEFAULT_RAY_VERSION
    group = spec.group("cpu")
    assert (group.effective_min_replicas, group.replicas, group.effective_max_replicas) == (2, 2, 2)
    assert [n.name for n in spec.desired_nodes()] == ["head", "cpu-0", "cpu-1"]
    assert spec.desired_nodes()[0].is_head


@pytest.mark.parametrize("name", ["Demo", "-demo", "demo-", "de_mo", "", "a" * 41, "../etc", "demo/x", "dé"])
def test_rejects_names_that_are_not_dns_labels(name: str) -> None:
    with pytest.raises(errors.InvalidSpec, match="name"):
        make(name=name)


@pytest.mark.parametrize(
    ("group", "fragment"),
    [
        ({"name": "cpu", "replicas": -1}, "replicas"),
        ({"name": "cpu", "replicas": 100000}, "replicas"),
        ({"name": "cpu", "replicas": 5, "max_replicas": 3}, "outside"),
        ({"name": "cpu", "replicas": 1, "min_replicas": 4, "max_replicas": 3}, "min_replicas"),
        ({"name": "cpu", "replicas": 1, "cpus": -2}, "cpus"),
        ({"name": "cpu", "replicas": 1, "memory": "lots"}, "byte quantity"),
        ({"name": "cpu", "replicas": 1, "object_store_memory": "1Mi"}, "at least 80Mi"),
        ({"name": "cpu", "replicas": 1, "resources": {"CPU": 2}}, "built in"),
        ({"name": "cpu", "replicas": 1, "labels": {"ray.io/node-group": "x"}}, "reserved prefix"),
        ({"name": "cpu", "replicas": 1, "labels": {"zone": "a b"}}, "label value"),
        ({"name": "cpu", "replicas": 1, "gpu": 1}, "Extra inputs"),
        ({"name": "headgroup", "replicas": 1}, "reserved for the head"),
    ],
)
def test_rejects_bad_worker_groups_with_the_field_named(group: dict[str, object], fragment: str) -> None:
    with pytest.raises(errors.InvalidSpec, match=fragment) as caught:
        make(worker_groups=[group])
    assert caught.value.detail and all("field" in problem for problem in caught.value.detail)


def test_rejects_unknown_top_level_fields_and_duplicate_groups() -> None:
    with pytest.raises(errors.InvalidSpec, match="colour"):
        make(colour="blue")
    with pytest.raises(errors.InvalidSpec, match="repeated: cpu"):
        make(worker_groups=[{"name": "cpu"}, {"name": "cpu"}])


def test_rejects_reserved_and_malformed_env_names() -> None:
    with pytest.raises(errors.InvalidSpec, match="RAYPOD_"):
        make(env={"RAYPOD_HOME": "/x"})
    with pytest.raises(errors.InvalidSpec, match="environment variable name"):
        make(env={"1BAD": "x"})


@pytest.mark.parametrize(
    ("text", "expected"),
    [("512Mi", 512 * 2**20), ("2Gi", 2 * 2**30), ("1G", 10**9), ("1.5Gi", int(1.5 * 2**30)), (1024, 1024)],
)
def test_parses_byte_quantities(text: object, expected: int) -> None:
    assert spec_mod.parse_bytes(text) == expected


def test_yaml_round_trip_keeps_the_spec_and_prints_quantities() -> None:
    spec = make(env={"A": "1"}, runtime_env={"pip": ["requests"]}, head={"memory": "2Gi"})
    text = spec.to_yaml()
    assert "memory: 2Gi" in text
    assert spec_mod.load_spec(text) == spec


def test_load_spec_rejects_non_mappings_and_broken_yaml() -> None:
    with pytest.raises(errors.InvalidSpec, match="mapping"):
        spec_mod.load_spec("- a\n- b\n")
    with pytest.raises(errors.InvalidSpec, match="not valid YAML"):
        spec_mod.load_spec("name: [unclosed")


def test_with_replicas_validates_bounds_and_group() -> None:
    spec = make(worker_groups=[{"name": "cpu", "replicas": 1, "min_replicas": 0, "max_replicas": 3}])
    assert spec.with_replicas("cpu", 3).group("cpu").replicas == 3
    with pytest.raises(errors.InvalidSpec, match="outside"):
        spec.with_replicas("cpu", 4)
    with pytest.raises(errors.NotFound, match="groups: cpu"):
        spec.with_replicas("gpu", 1)


def test_fixed_size_group_follows_its_replicas_when_scaled() -> None:
    scaled = make().with_replicas("cpu", 5)
    assert scaled.group("cpu").effective_max_replicas == 5


def test_fault_tolerance_reaches_only_the_head_environment() -> None:
    spec = make(gcs_fault_tolerance={"redis_address": "127.0.0.1:6379"}, env={"A": "1"})
    head, worker, _ = spec.desired_nodes()
    assert head.env == {
        "A": "1",
        "RAY_REDIS_ADDRESS": "127.0.0.1:6379",
        "RAY_external_storage_namespace": "default-demo",
    }
    assert worker.env == {"A": "1"}


def test_the_documented_example_spec_is_valid() -> None:
    from pathlib import Path

    text = (Path(__file__).parents[1] / "docs" / "clusters.md").read_text()
    example = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    spec = spec_mod.load_spec(example)
    assert spec.group("cpu").labels == {"team": "search"}
