"""What a cluster's groups should be from Ray's own demand, decided by Ray's own autoscaler.

Ray's autoscaler v2 splits into a scheduler (``ResourceDemandScheduler``: pending tasks, actors and placement groups,
and idle nodes -> nodes to launch and to terminate) and an instance manager that carries the decisions out through a
cloud provider, with its own state machine, threads and drains. raypod already has the part that carries out: its
loop. So raypod asks the scheduler and turns its answer into replica counts, the same request a user makes; the loop
stays the one actor that starts, drains and stops nodes, and a scale-up passes governance like any other.

Pure: no I/O, no clock. The cluster's resource state (what its GCS reports, serialized) comes in as bytes.
"""

from __future__ import annotations

import functools
import importlib
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from raypod import spec as spec_mod
from raypod import state
from raypod.spec.autoscaling import Upscaling

# The node type of every node the autoscaler may not add or remove: the head, workspaces, fixed-size groups.
FIXED = "(fixed)"
# As KubeRay maps upscalingMode onto Ray's upscaling_speed: pending launches per running node of the group.
UPSCALING_SPEED = {Upscaling.DEFAULT: 1000.0, Upscaling.AGGRESSIVE: 1000.0, Upscaling.CONSERVATIVE: 1.0}

NO_SHAPE_FITS = "no node shape fits"
OVER_MAX = "over max_replicas"
NODES_STARTING = "nodes starting"


@functools.cache
def _ray(module: str) -> Any:
    """One of Ray's modules, imported on first use: the local backend must set Ray's authentication mode before Ray's
    core library loads in this process (and Ray's generated protobuf modules have no type stubs)."""
    return importlib.import_module(module)


def _pb() -> Any:
    return _ray("ray.core.generated.autoscaler_pb2")


def _im() -> Any:
    return _ray("ray.core.generated.instance_manager_pb2")


@dataclass(frozen=True)
class Demand:
    """Work Ray cannot place yet: ``count`` requests of one shape (tasks and actors) or one placement group."""

    shape: tuple[tuple[str, float], ...]
    count: int
    placement_group: bool
    why: str  # NO_SHAPE_FITS, OVER_MAX, NODES_STARTING

    def describe(self) -> str:
        return self.as_status().describe()

    def as_status(self, reason: str | None = None) -> state.PendingDemand:
        return state.PendingDemand(
            resources=dict(self.shape),
            count=self.count,
            placement_group=self.placement_group,
            reason=reason or self.why,
        )


@dataclass(frozen=True)
class Resize:
    group: str
    before: int
    after: int
    why: str  # the demand or the idleness behind it, in words

    @property
    def up(self) -> bool:
        return self.after > self.before


@dataclass(frozen=True)
class Decision:
    resizes: tuple[Resize, ...] = ()
    demands: tuple[Demand, ...] = ()  # everything Ray waits for, with why

    def replicas(self) -> dict[str, int]:
        return {resize.group: resize.after for resize in self.resizes}

    @property
    def infeasible(self) -> tuple[Demand, ...]:
        return tuple(d for d in self.demands if d.why == NO_SHAPE_FITS)


@dataclass
class _Nodes:
    instances: list[Any] = field(default_factory=list)
    running: Counter[str] = field(default_factory=Counter)
    pending: Counter[str] = field(default_factory=Counter)
    fixed_shapes: list[dict[str, float]] = field(default_factory=list)
    idle_ms: dict[str, int] = field(default_factory=dict)  # how long Ray has seen each running node idle


def scaling_groups(spec: spec_mod.ClusterSpec) -> dict[str, spec_mod.WorkerGroupSpec]:
    """The groups the autoscaler sizes: those whose ``min_replicas`` < ``max_replicas``."""
    if spec.autoscaling is None:
        return {}
    return {g.name: g for g in spec.worker_groups if g.effective_min_replicas < g.effective_max_replicas}


def decide(spec: spec_mod.ClusterSpec, observed: state.ObservedCluster, resource_state: bytes) -> Decision:
    """The resizes Ray's scheduler asks for, given the cluster's spec, what runs, and its GCS's resource state
    (``ClusterResourceState``, serialized). Idle nodes go highest index first (a scale-down removes the highest
    indices), so an idle node waits while one above it is busy."""
    settings = spec.autoscaling
    groups = scaling_groups(spec)
    if settings is None or not groups:
        return Decision()
    config, scheduler = _ray("ray.autoscaler.v2.instance_manager.config"), _ray("ray.autoscaler.v2.scheduler")
    ray_state = _pb().ClusterResourceState()
    ray_state.ParseFromString(resource_state)
    shapes = {name: _node_resources(spec, group) for name, group in groups.items()}
    nodes = _instances(spec, observed, ray_state, groups)
    configs = {
        name: config.NodeTypeConfig(
            name=name,
            min_worker_nodes=group.effective_min_replicas,
            max_worker_nodes=group.effective_max_replicas,
            resources=shapes[name],
            labels=dict(group.labels),
        )
        for name, group in groups.items()
    }
    fixed = sum(1 for i in nodes.instances if i.im_instance is not None and i.im_instance.instance_type == FIXED)
    configs[FIXED] = config.NodeTypeConfig(name=FIXED, min_worker_nodes=fixed, max_worker_nodes=fixed)
    reply = scheduler.ResourceDemandScheduler().schedule(
        scheduler.SchedulingRequest(
            disable_launch_config_check=True,
            node_type_configs=configs,
            idle_timeout_s=float(settings.idle_timeout_s),
            resource_requests=list(ray_state.pending_resource_requests),
            gang_resource_requests=list(ray_state.pending_gang_resource_requests),
            cluster_resource_constraints=list(ray_state.cluster_resource_constraints),
            current_instances=nodes.instances,
        )
    )
    resizes: list[Resize] = []
    found = _demands(ray_state, reply.infeasible_resource_requests, reply.infeasible_gang_resource_requests)
    demands = tuple(_why(d, list(shapes.values()) + nodes.fixed_shapes) for d in found)
    waiting = "; ".join(d.describe() for d in demands if d.why != NO_SHAPE_FITS) or "Ray's demand"
    speed = UPSCALING_SPEED[settings.upscaling]
    launched: set[str] = set()
    for launch in reply.to_launch:
        group = groups.get(launch.instance_type)
        if group is None or launch.count <= 0:
            continue
        room = max(1, math.ceil(speed * max(nodes.running[group.name], 1))) - nodes.pending[group.name]
        after = min(group.replicas + min(launch.count, max(room, 0)), group.effective_max_replicas)
        if after > group.replicas:
            launched.add(group.name)
            resizes.append(Resize(group.name, group.replicas, after, f"pending demand: {waiting}"))
    idle: Counter[str] = Counter()
    for terminate in reply.to_terminate:
        if terminate.cause == _im().TerminationRequest.Cause.IDLE:
            idle[terminate.instance_type] += 1
    for name, count in sorted(idle.items()):
        group = groups.get(name)
        if group is None or name in launched:
            continue
        # Ray's scheduler says how many may go (min_replicas and pending demand respected); which ones is raypod's
        # naming's: the highest indices, each idle past the timeout in Ray's own eyes.
        after = group.replicas
        while (
            group.replicas - after < count
            and after > group.effective_min_replicas
            and nodes.idle_ms.get(spec_mod.node_name(name, after - 1), 0) > settings.idle_timeout_s * 1000
        ):
            after -= 1
        if after < group.replicas:
            gone = ", ".join(spec_mod.node_name(name, i) for i in range(after, group.replicas))
            why = f"idle for over {settings.idle_timeout_s} s: {gone}"
            resizes.append(Resize(name, group.replicas, after, why))
    return Decision(tuple(resizes), demands)


def nothing_held(resource_state: bytes) -> bool:
    """Whether nothing waits to be placed and no task, actor or placement group holds any node's resources (the
    object store aside: objects outlive the work that made them)."""
    ray_state = _pb().ClusterResourceState()
    ray_state.ParseFromString(resource_state)
    if (
        ray_state.pending_resource_requests
        or ray_state.pending_gang_resource_requests
        or ray_state.cluster_resource_constraints
    ):
        return False
    alive = [n for n in ray_state.node_states if n.status in (_pb().NodeStatus.RUNNING, _pb().NodeStatus.IDLE)]
    for node in alive:
        available = dict(node.available_resources)
        for name, total in node.total_resources.items():
            if name != "object_store_memory" and not name.startswith("node:") and available.get(name, 0.0) < total:
                return False
    return bool(alive)


def _instances(
    spec: spec_mod.ClusterSpec,
    observed: state.ObservedCluster,
    ray_state: Any,
    groups: Mapping[str, spec_mod.WorkerGroupSpec],
) -> _Nodes:
    """Each node as the scheduler's instance: a scaling group's node that runs in Ray is RAY_RUNNING (its resources
    and idleness Ray's), one that is wanted but not running yet ALLOCATED (capacity on its way); every other node
    that runs in Ray is a fixed one, which takes demand but is never added or removed."""
    alive = {
        _hex(node.node_id): node
        for node in ray_state.node_states
        if node.status in (_pb().NodeStatus.RUNNING, _pb().NodeStatus.IDLE)
    }
    found = _Nodes()
    for wanted in spec.desired_nodes():
        node = observed.nodes.get(wanted.name)
        ray_node = alive.get(node.ray_node_id) if node is not None and node.ray_node_id else None
        running = ray_node is not None and node is not None and node.phase is state.NodePhase.RUNNING
        if wanted.group in groups:
            status = _im().Instance.RAY_RUNNING if running else _im().Instance.ALLOCATED
            (found.running if running else found.pending)[wanted.group] += 1
            if running and ray_node is not None:
                found.idle_ms[wanted.name] = int(ray_node.idle_duration_ms)
            found.instances.append(_instance(wanted.name, wanted.group, status, _im().NodeKind.WORKER, ray_node))
        elif running and ray_node is not None:
            found.fixed_shapes.append(dict(ray_node.total_resources))
            running_status, head_kind = _im().Instance.RAY_RUNNING, _im().NodeKind.HEAD
            found.instances.append(_instance(wanted.name, FIXED, running_status, head_kind, ray_node))
    return found


def _instance(name: str, node_type: str, status: int, kind: int, ray_node: Any) -> Any:
    instance = _im().Instance(
        instance_id=name,
        instance_type=node_type,
        status=status,
        node_kind=kind,
        cloud_instance_id=name,
        node_id=_hex(ray_node.node_id) if ray_node is not None else "",
    )
    running = status == _im().Instance.RAY_RUNNING
    return _ray("ray.autoscaler.v2.schema").AutoscalerInstance(
        im_instance=instance, ray_node=ray_node if running else None, cloud_instance_id=name
    )


def _node_resources(spec: spec_mod.ClusterSpec, group: spec_mod.WorkerGroupSpec) -> dict[str, float]:
    """What one node of the group offers Ray, as the backend starts it (``--num-cpus``, ``--memory``, ...)."""
    node = spec_mod.NodeSpec.from_group(group.name, spec_mod.node_name(group.name, 0), group, {}, is_head=False)
    offered: dict[str, float] = {
        "CPU": float(node.cpus),
        "memory": float(node.memory),
        "object_store_memory": float(node.object_store_memory),
    }
    if node.gpus:
        offered["GPU"] = float(node.gpus)
    offered.update(node.resources)
    return offered


def _demands(
    ray_state: Any,
    infeasible: Iterable[Any],
    infeasible_gangs: Iterable[Any],
) -> list[Demand]:
    """What Ray waits for, shape by shape: tasks and actors counted together, each placement group on its own;
    what the scheduler could not place (``infeasible``) is marked OVER_MAX for ``_why`` to refine."""
    not_placed = Counter(_shape(r.resources_bundle) for r in infeasible)
    found: list[Demand] = []
    for by_count in ray_state.pending_resource_requests:
        shape = _shape(by_count.request.resources_bundle)
        stuck = min(not_placed[shape], by_count.count)
        not_placed[shape] -= stuck
        if stuck:
            found.append(Demand(shape, stuck, False, OVER_MAX))
        if by_count.count - stuck:
            found.append(Demand(shape, by_count.count - stuck, False, NODES_STARTING))
    stuck_gangs = {gang.details for gang in infeasible_gangs}
    for gang in ray_state.pending_gang_resource_requests:
        bundles = [r.resources_bundle for r in gang.requests]
        shape = _shape(bundles[0]) if bundles else ()
        why = OVER_MAX if gang.details in stuck_gangs else NODES_STARTING
        found.append(Demand(shape, len(bundles), True, why))
    return _merged(found)


def _why(demand: Demand, node_shapes: list[dict[str, float]]) -> Demand:
    """OVER_MAX becomes NO_SHAPE_FITS where not even an empty node of any group (or a fixed node) could hold it."""
    if demand.why != OVER_MAX:
        return demand
    fits = any(all(value <= shape.get(name, 0.0) for name, value in demand.shape) for shape in node_shapes)
    return demand if fits else Demand(demand.shape, demand.count, demand.placement_group, NO_SHAPE_FITS)


def _merged(demands: list[Demand]) -> list[Demand]:
    counts: Counter[tuple[tuple[tuple[str, float], ...], bool, str]] = Counter()
    for demand in demands:
        if demand.placement_group:
            continue
        counts[(demand.shape, demand.placement_group, demand.why)] += demand.count
    merged = [Demand(shape, count, group, why) for (shape, group, why), count in counts.items()]
    return sorted(merged + [d for d in demands if d.placement_group], key=lambda d: (d.why, d.shape, d.count))


def _shape(bundle: Mapping[str, float]) -> tuple[tuple[str, float], ...]:
    return tuple(sorted((name, float(value)) for name, value in bundle.items()))


def _hex(node_id: bytes) -> str:
    return node_id.hex()
