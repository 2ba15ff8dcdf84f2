"""Pure admission checks: refuse what cannot work on the backend's machines before anything starts."""

from __future__ import annotations

from collections.abc import Iterable

from raypod import errors
from raypod import spec as spec_mod
from raypod.backends import base


def check_features(spec: spec_mod.ClusterSpec, features: frozenset[base.Feature]) -> None:
    """Raises InvalidSpec when the spec asks for something the backend cannot do."""
    if spec.gcs_fault_tolerance is not None and base.Feature.GCS_FAULT_TOLERANCE not in features:
        raise errors.InvalidSpec("this backend does not support GCS fault tolerance")
    if spec.health_checks and base.Feature.NODE_COMMANDS not in features:
        raise errors.InvalidSpec(
            "health_checks: this backend cannot run commands on nodes yet (on Kubernetes, use the pods' probes)"
        )
    if spec.autoscaling is not None and base.Feature.AUTOSCALING not in features:
        raise errors.InvalidSpec(
            "autoscaling: this backend does not scale from Ray's demand (docs/autoscaling.md): "
            "scale with `raypod cluster scale`, or leave autoscaling out"
        )
    if spec.spaces and base.Feature.SPACES not in features:
        raise errors.InvalidSpec("spaces: workspaces are not available on this backend yet (docs/kubernetes.md)")


NO_HANGWATCH = (
    "hung-job detection does not run on this backend yet (no agent runs in KubeRay's pods; docs/kubernetes.md): "
    "use Ray Train's own timeouts"
)


def check_hangwatch(features: frozenset[base.Feature], asked: bool = True) -> None:
    """Raises InvalidSpec where hang detection was asked for (a job's --hang-* settings, the hangs of a cluster)
    and the backend runs no agent: saying nothing would read as 'no hang'."""
    if asked and base.Feature.HANGWATCH not in features:
        raise errors.InvalidSpec(NO_HANGWATCH)


def check_capacity(
    spec: spec_mod.ClusterSpec, others: Iterable[spec_mod.ClusterSpec], capacity: base.HostCapacity
) -> None:
    """Check one cluster, next to the clusters already admitted, against what the host can hold.

    CPUs are logical in Ray, so several 1-CPU nodes on a 2-core host are fine; a single node may not claim
    more CPUs or GPUs than a machine has, and all nodes together may not need more memory than there is.

    Raises:
        InsufficientCapacity: with the numbers that did not fit.
    """
    nodes = spec.desired_nodes()
    for node in nodes:
        if capacity.cpus_per_node is not None and node.cpus > capacity.cpus_per_node:
            raise errors.InsufficientCapacity(
                f"node {node.name} asks for {node.cpus} CPUs; a node here has at most {capacity.cpus_per_node}"
            )
        if capacity.gpus_per_node is not None and node.gpus > capacity.gpus_per_node:
            have = capacity.gpus_per_node or "no"
            raise errors.InsufficientCapacity(f"node {node.name} asks for {node.gpus} GPUs; this host has {have} GPUs")

    others = list(others)
    if capacity.memory_bytes is not None:
        needed = memory_needed(spec, capacity)
        used = sum(memory_needed(other, capacity) for other in others)
        if used + needed > capacity.memory_bytes:
            where = (
                f"only {_gib(max(capacity.memory_bytes - used, 0))} of {_gib(capacity.memory_bytes)} is left next to "
                f"{len(others)} other cluster(s)"
                if others
                else f"this host has {_gib(capacity.memory_bytes)} in all"
            )
            raise errors.InsufficientCapacity(
                f"cluster '{spec.name}' needs {_gib(needed)} of memory ({len(nodes)} nodes: Ray memory, object "
                f"store and process overhead) but {where}; lower replicas or memory",
                detail={"needed_bytes": needed, "available_bytes": max(capacity.memory_bytes - used, 0)},
            )
    if capacity.shared_memory_bytes is not None:
        needed = sum(node.object_store_memory for node in nodes)
        used = sum(node.object_store_memory for other in others for node in other.desired_nodes())
        if used + needed > capacity.shared_memory_bytes:
            raise errors.InsufficientCapacity(
                f"cluster '{spec.name}' needs {_gib(needed)} of object store but only "
                f"{_gib(max(capacity.shared_memory_bytes - used, 0))} of shared memory is left"
            )


def memory_needed(spec: spec_mod.ClusterSpec, capacity: base.HostCapacity) -> int:
    """What the nodes of ``spec`` take of the host: Ray memory, object store and the processes themselves."""
    return sum(
        node.memory
        + node.object_store_memory
        + (capacity.head_overhead_bytes if node.is_head else capacity.worker_overhead_bytes)
        for node in spec.desired_nodes()
    )


def _gib(number: int) -> str:
    return f"{number / 2**30:.1f} GiB"
