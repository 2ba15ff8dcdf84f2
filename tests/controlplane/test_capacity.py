from __future__ import annotations

import pytest

from raypod import errors
from raypod import spec as spec_mod
from raypod.backends import base
from raypod.controlplane import capacity

HOST = base.HostCapacity(
    cpus_per_node=2,
    memory_bytes=24 * 2**30,
    shared_memory_bytes=12 * 2**30,
    gpus_per_node=0,
    head_overhead_bytes=2**30,
    worker_overhead_bytes=2**28,
)


def cluster(name: str = "demo", **group: object) -> spec_mod.ClusterSpec:
    return spec_mod.parse_spec({"name": name, "worker_groups": [{"name": "cpu", **group}]})


def test_several_one_cpu_nodes_fit_on_a_two_core_host() -> None:
    capacity.check_capacity(cluster(replicas=4, cpus=1), [], HOST)


def test_a_node_cannot_claim_more_cpus_or_gpus_than_the_host_has() -> None:
    with pytest.raises(errors.InsufficientCapacity, match="64 CPUs"):
        capacity.check_capacity(cluster(replicas=1, cpus=64), [], HOST)
    with pytest.raises(errors.InsufficientCapacity, match="1 GPUs; this host has no GPUs"):
        capacity.check_capacity(cluster(replicas=1, gpus=1), [], HOST)


def test_memory_beyond_ram_is_refused_and_counts_other_clusters() -> None:
    with pytest.raises(errors.InsufficientCapacity, match="needs"):
        capacity.check_capacity(cluster(replicas=1, memory="64Gi"), [], HOST)
    big = cluster("big", replicas=1, memory="15Gi")
    capacity.check_capacity(cluster(replicas=1, memory="4Gi"), [], HOST)
    with pytest.raises(errors.InsufficientCapacity, match="next to 1 other cluster"):
        capacity.check_capacity(cluster(replicas=1, memory="6Gi"), [big], HOST)


def test_object_stores_beyond_shared_memory_are_refused() -> None:
    with pytest.raises(errors.InsufficientCapacity, match="object store"):
        capacity.check_capacity(cluster(replicas=2, object_store_memory="6Gi", memory="100Mi"), [], HOST)


def test_absurd_replica_counts_are_refused() -> None:
    with pytest.raises(errors.InsufficientCapacity):
        capacity.check_capacity(cluster(replicas=900), [], HOST)


def test_fault_tolerance_needs_backend_support() -> None:
    spec = spec_mod.parse_spec({"name": "ft", "gcs_fault_tolerance": {"redis_address": "127.0.0.1:6379"}})
    with pytest.raises(errors.InvalidSpec, match="fault tolerance"):
        capacity.check_features(spec, frozenset())
    capacity.check_features(spec, frozenset({base.Feature.GCS_FAULT_TOLERANCE}))


def test_autoscaling_is_refused_with_why_where_the_backend_does_not_scale_from_demand() -> None:
    spec = spec_mod.parse_spec(
        {"name": "elastic", "worker_groups": [{"name": "cpu", "max_replicas": 4}], "autoscaling": {}}
    )
    with pytest.raises(errors.InvalidSpec, match="does not scale from Ray's demand"):
        capacity.check_features(spec, frozenset())
    capacity.check_features(spec, frozenset({base.Feature.AUTOSCALING}))
