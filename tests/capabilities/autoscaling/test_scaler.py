"""The autoscaler's decision, pure: Ray's own v2 scheduler over the cluster's spec, what runs, and a resource state
built as a GCS reports it (no Ray runs here: the scheduler is a library)."""

from __future__ import annotations

from typing import Any

import pytest
from ray.core.generated import autoscaler_pb2 as _pb

from raypod import spec as spec_mod
from raypod import state
from raypod.backends.fake import fake_ray_node_id
from raypod.capabilities.autoscaling import scaler

pb: Any = _pb
Phase = state.NodePhase


def cluster(replicas: int = 1, upscaling: str = "Default", min_replicas: int = 1, max_replicas: int = 4) -> Any:
    return spec_mod.parse_spec(
        {
            "name": "grow",
            "head": {"cpus": 0},
            "worker_groups": [
                {"name": "cpu", "replicas": replicas, "min_replicas": min_replicas, "max_replicas": max_replicas}
            ],
            "autoscaling": {"idle_timeout_s": 10, "upscaling": upscaling},
        }
    )


def node_id(name: str) -> bytes:
    return bytes.fromhex(fake_ray_node_id(name))


def observed(*running: str, starting: tuple[str, ...] = ()) -> state.ObservedCluster:
    nodes = {
        name: state.ObservedNode(
            name, name.split("-")[0], name == "head", Phase.RUNNING, 0.0, ray_node_id=node_id(name).hex()
        )
        for name in ("head", *running)
    }
    for name in starting:
        nodes[name] = state.ObservedNode(name, "cpu", False, Phase.STARTING, 0.0)
    return state.ObservedCluster(nodes=nodes)


def resource_state(
    busy: dict[str, bool] | None = None,
    idle_s: dict[str, float] | None = None,
    tasks: tuple[dict[str, float], int] | None = None,
    gang: int = 0,
    gang_cpus: float = 1.0,
) -> bytes:
    """The head (no CPU; idle when ``idle_s`` names it) and each named worker (1 CPU, free unless ``busy``, idle for
    ``idle_s``), with ``tasks``
    (a shape, a count) and a placement group of ``gang`` bundles waiting."""
    found = pb.ClusterResourceState()
    head_idle_ms = int((idle_s or {}).get("head", 0) * 1000)
    head_status = pb.NodeStatus.IDLE if head_idle_ms else pb.NodeStatus.RUNNING
    head = found.node_states.add(node_id=node_id("head"), status=head_status, idle_duration_ms=head_idle_ms)
    head.total_resources.update({"memory": 2.0**30, "node:__internal_head__": 1.0})
    head.available_resources.update({"memory": 2.0**30, "node:__internal_head__": 1.0})
    for name, is_busy in (busy or {}).items():
        idle_ms = int((idle_s or {}).get(name, 0) * 1000)
        status = pb.NodeStatus.RUNNING if is_busy else pb.NodeStatus.IDLE
        node = found.node_states.add(node_id=node_id(name), status=status, idle_duration_ms=idle_ms)
        node.total_resources.update({"CPU": 1.0, "memory": 2.0**30, "object_store_memory": 256.0 * 2**20})
        node.available_resources.update({"CPU": 0.0 if is_busy else 1.0, "memory": 2.0**30})
    if tasks is not None:
        waiting = found.pending_resource_requests.add(count=tasks[1])
        waiting.request.resources_bundle.update(tasks[0])
    if gang:
        group = found.pending_gang_resource_requests.add(details="pg-1:PACK|PENDING")
        for _ in range(gang):
            group.requests.add().resources_bundle.update({"CPU": gang_cpus})
    return bytes(found.SerializeToString())


def test_a_placement_group_grows_the_group_to_what_it_needs_at_once() -> None:
    decision = scaler.decide(cluster(), observed("cpu-0"), resource_state({"cpu-0": False}, gang=4))
    assert [(r.group, r.before, r.after) for r in decision.resizes] == [("cpu", 1, 4)]
    assert decision.resizes[0].why.startswith("pending demand: a placement group of 4 x {1 CPU}")
    assert [(d.count, d.placement_group, d.why) for d in decision.demands] == [(4, True, scaler.NODES_STARTING)]


def test_conservative_upscaling_starts_no_more_nodes_at_once_than_the_group_runs() -> None:
    spec = cluster(upscaling="Conservative")
    decision = scaler.decide(spec, observed("cpu-0"), resource_state({"cpu-0": False}, gang=4))
    assert [(r.before, r.after) for r in decision.resizes] == [(1, 2)]


def test_nodes_already_starting_count_as_capacity_on_its_way() -> None:
    spec = cluster(replicas=4)
    decision = scaler.decide(spec, observed("cpu-0", starting=("cpu-1",)), resource_state({"cpu-0": True}, gang=3))
    assert decision.resizes == ()


def test_tasks_grow_the_group_by_what_does_not_fit_and_stop_at_max_replicas() -> None:
    decision = scaler.decide(cluster(), observed("cpu-0"), resource_state({"cpu-0": True}, tasks=({"CPU": 1}, 6)))
    assert [(r.before, r.after) for r in decision.resizes] == [(1, 4)]
    assert {(d.count, d.why) for d in decision.demands} == {(3, scaler.NODES_STARTING), (3, scaler.OVER_MAX)}


def test_a_demand_no_node_shape_fits_is_infeasible_and_not_scaled_for() -> None:
    decision = scaler.decide(cluster(), observed("cpu-0"), resource_state({"cpu-0": False}, tasks=({"CPU": 64}, 1)))
    assert decision.resizes == ()
    assert [(d.describe(), d.why) for d in decision.infeasible] == [("1 x {64 CPU}", scaler.NO_SHAPE_FITS)]


def test_a_placement_group_that_cannot_fit_within_max_replicas_waits_over_max_and_starts_nothing() -> None:
    # Four bundles, one busy node and room for three more: all or nothing, so nothing.
    decision = scaler.decide(cluster(), observed("cpu-0"), resource_state({"cpu-0": True}, gang=4))
    assert decision.resizes == ()
    assert [(d.count, d.why) for d in decision.demands] == [(4, scaler.OVER_MAX)]


def test_a_placement_group_larger_than_max_replicas_waits_over_max_and_starts_nothing() -> None:
    decision = scaler.decide(cluster(), observed("cpu-0"), resource_state({"cpu-0": False}, gang=6))
    assert decision.resizes == ()
    assert [(d.count, d.why) for d in decision.demands] == [(6, scaler.OVER_MAX)]


def test_idle_nodes_go_highest_index_first_down_to_min_replicas() -> None:
    idle = {"cpu-0": 30.0, "cpu-1": 30.0, "cpu-2": 12.0}
    decision = scaler.decide(
        cluster(replicas=3),
        observed("cpu-0", "cpu-1", "cpu-2"),
        resource_state({"cpu-0": False, "cpu-1": False, "cpu-2": False}, idle_s=idle),
    )
    assert [(r.before, r.after, r.why) for r in decision.resizes] == [(3, 1, "idle for over 10 s: cpu-1, cpu-2")]


@pytest.mark.parametrize(
    ("busy", "idle"),
    [
        ({"cpu-0": False, "cpu-1": False, "cpu-2": True}, {"cpu-0": 30.0, "cpu-1": 30.0}),  # the top one works
        ({"cpu-0": False, "cpu-1": False, "cpu-2": False}, {"cpu-0": 30.0, "cpu-1": 30.0, "cpu-2": 5.0}),  # too soon
    ],
)
def test_an_idle_node_below_one_not_idle_long_enough_stays(busy: dict[str, bool], idle: dict[str, float]) -> None:
    running = observed("cpu-0", "cpu-1", "cpu-2")
    decision = scaler.decide(cluster(replicas=3), running, resource_state(busy, idle_s=idle))
    assert decision.resizes == ()


def test_a_cluster_without_autoscaling_is_left_alone() -> None:
    manual = cluster().model_copy(update={"autoscaling": None})
    assert scaler.scaling_groups(manual) == {}
    assert scaler.decide(manual, observed("cpu-0"), resource_state(gang=4)) == scaler.Decision()
