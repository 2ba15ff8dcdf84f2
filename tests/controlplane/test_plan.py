"""Table tests of the pure planner."""

from __future__ import annotations

from raypod import actions, state
from raypod import spec as spec_mod
from raypod.backends import base
from raypod.controlplane import plan

NOW = 1_000_000.0
DRAIN = frozenset({base.Feature.DRAIN})
Phase = state.NodePhase


def spec(replicas: int = 2, fault_tolerant: bool = False) -> spec_mod.ClusterSpec:
    data: dict[str, object] = {"name": "demo", "worker_groups": [{"name": "cpu", "replicas": replicas}]}
    if fault_tolerant:
        data["gcs_fault_tolerance"] = {"redis_address": "127.0.0.1:6379"}
    return spec_mod.parse_spec(data)


def node(name: str, phase: Phase = Phase.RUNNING, started: float = NOW - 10, **extra: object) -> state.ObservedNode:
    return state.ObservedNode(
        name=name,
        group="headgroup" if name == "head" else "cpu",
        is_head=name == "head",
        phase=phase,
        started_at=started,
        ray_node_id=f"id-{name}" if phase in (Phase.RUNNING, Phase.DRAINING) else None,
        **extra,  # type: ignore[arg-type]
    )


def observed(
    *nodes: state.ObservedNode, strays: frozenset[str] = frozenset(), gcs_reachable: bool = True
) -> state.ObservedCluster:
    return state.ObservedCluster(nodes={n.name: n for n in nodes}, stray_nodes=strays, gcs_reachable=gcs_reachable)


def summary(planned: list[actions.Action]) -> list[tuple[str, str, str]]:
    rows = []
    for action in planned:
        name = action.node.name if isinstance(action, actions.CreateNode) else getattr(action, "name", "")
        rows.append((type(action).__name__, name, action.reason))
    return rows


def run(desired: spec_mod.ClusterSpec, seen: state.ObservedCluster, **kwargs: object) -> list[tuple[str, str, str]]:
    options: dict[str, object] = {"deleting": False, "now": NOW, "features": DRAIN}
    options.update(kwargs)
    return summary(plan.plan(desired, seen, **options))  # type: ignore[arg-type]


def test_new_cluster_starts_the_head_first_and_workers_once_it_runs() -> None:
    assert run(spec(), observed()) == [("CreateNode", "head", "CreatedHead")]
    assert run(spec(), observed(node("head", Phase.STARTING))) == []
    assert run(spec(), observed(node("head"))) == [
        ("CreateNode", "cpu-0", "CreatedWorker"),
        ("CreateNode", "cpu-1", "CreatedWorker"),
    ]


def test_converged_cluster_needs_nothing() -> None:
    assert run(spec(), observed(node("head"), node("cpu-0"), node("cpu-1"))) == []


def test_scale_down_drains_running_nodes_before_deleting_them() -> None:
    seen = observed(node("head"), node("cpu-0"), node("cpu-1"))
    planned = plan.plan(spec(1), seen, deleting=False, now=NOW, features=DRAIN)
    assert summary(planned) == [("DrainNode", "cpu-1", "DrainedNode")]
    drain = planned[0]
    assert isinstance(drain, actions.DrainNode)
    assert drain.deadline == NOW + plan.DEFAULT_SETTINGS.drain_timeout_s


def test_draining_node_is_left_alone_until_it_exits_or_its_deadline_passes() -> None:
    draining = node("cpu-1", Phase.DRAINING, drain_deadline=NOW + 5)
    assert run(spec(1), observed(node("head"), node("cpu-0"), draining)) == []
    late = node("cpu-1", Phase.DRAINING, drain_deadline=NOW - 1)
    assert run(spec(1), observed(node("head"), node("cpu-0"), late)) == [("DeleteNode", "cpu-1", "DeletedNode")]
    exited = node("cpu-1", Phase.DEAD)
    assert run(spec(1), observed(node("head"), node("cpu-0"), exited)) == [("DeleteNode", "cpu-1", "DeletedNode")]


def test_without_drain_support_scale_down_deletes() -> None:
    seen = observed(node("head"), node("cpu-0"), node("cpu-1"))
    assert run(spec(1), seen, features=frozenset()) == [("DeleteNode", "cpu-1", "DeletedNode")]


def test_dead_worker_is_removed_then_replaced_under_the_same_name() -> None:
    seen = observed(node("head"), node("cpu-0", Phase.DEAD), node("cpu-1"))
    assert run(spec(), seen) == [
        ("DeleteNode", "cpu-0", "RemovedDeadNode"),
        ("CreateNode", "cpu-0", "ReplacedNode"),
    ]


def test_dead_head_without_fault_tolerance_restarts_the_whole_cluster() -> None:
    seen = observed(node("head", Phase.DEAD), node("cpu-0"), node("cpu-1"))
    assert run(spec(), seen) == [
        ("DeleteNode", "cpu-0", "RestartedWithHead"),
        ("DeleteNode", "cpu-1", "RestartedWithHead"),
        ("DeleteNode", "head", "RemovedDeadNode"),
        ("CreateNode", "head", "ReplacedNode"),
    ]


def test_dead_head_with_fault_tolerance_keeps_the_workers() -> None:
    seen = observed(node("head", Phase.DEAD), node("cpu-0"), node("cpu-1"))
    assert run(spec(fault_tolerant=True), seen) == [
        ("DeleteNode", "head", "RemovedDeadNode"),
        ("CreateNode", "head", "ReplacedNode"),
    ]


def test_node_stuck_starting_is_restarted_after_the_timeout() -> None:
    stuck = node("cpu-1", Phase.STARTING, started=NOW - 1000)
    assert run(spec(), observed(node("head"), node("cpu-0"), stuck)) == [
        ("DeleteNode", "cpu-1", "NodeStartTimedOut"),
        ("CreateNode", "cpu-1", "ReplacedNode"),
    ]
    fresh = node("cpu-1", Phase.STARTING, started=NOW - 5)
    assert run(spec(), observed(node("head"), node("cpu-0"), fresh)) == []


def test_stray_processes_are_cleaned_up_first() -> None:
    seen = observed(node("head"), node("cpu-0"), node("cpu-1"), strays=frozenset({"old-7"}))
    assert run(spec(), seen) == [("DeleteNode", "old-7", "CleanedUpStrayProcesses")]


def test_deletion_stops_workers_before_the_head_then_releases() -> None:
    seen = observed(node("head"), node("cpu-1"), node("cpu-0"))
    assert run(spec(), seen, deleting=True) == [
        ("DeleteNode", "cpu-0", "DeletedNode"),
        ("DeleteNode", "cpu-1", "DeletedNode"),
        ("DeleteNode", "head", "DeletedNode"),
    ]
    assert run(spec(), observed(), deleting=True) == [("ReleaseCluster", "", "Deleted")]


def test_plan_is_deterministic() -> None:
    seen = observed(node("head"), node("cpu-0", Phase.DEAD))
    assert run(spec(3), seen) == run(spec(3), seen)


def test_gcs_unreachable_deletes_nothing_even_long_after_the_start_timeout() -> None:
    """The defect this guards: a GCS timeout looked like an empty node table, so every live node (the head
    included) was STARTING, and older than the start timeout it was deleted as NodeStartTimedOut."""
    old = NOW - 10 * plan.DEFAULT_SETTINGS.node_start_timeout_s
    unknown = [node(name, Phase.UNKNOWN, started=old) for name in ("head", "cpu-0", "cpu-1")]
    assert run(spec(), observed(*unknown, gcs_reachable=False)) == []


def test_gcs_unreachable_leaves_surplus_and_missing_nodes_alone() -> None:
    unknown = [node(name, Phase.UNKNOWN) for name in ("head", "cpu-0", "cpu-1", "cpu-2")]
    assert run(spec(3), observed(*unknown[:2], gcs_reachable=False)) == []  # no worker joins an unknown head
    assert run(spec(1), observed(*unknown, gcs_reachable=False)) == []  # no drain or delete of surplus either


def test_gcs_unreachable_still_replaces_a_node_whose_process_exited() -> None:
    seen = observed(node("head", Phase.UNKNOWN), node("cpu-0", Phase.DEAD), node("cpu-1", Phase.UNKNOWN))
    assert run(spec(), seen.__class__(nodes=seen.nodes, gcs_reachable=False)) == [
        ("DeleteNode", "cpu-0", "RemovedDeadNode")
    ]


def test_start_timeout_does_not_count_while_the_gcs_is_unreachable() -> None:
    stuck = node("cpu-1", Phase.STARTING, started=NOW - 1000)
    seen = observed(node("head", Phase.UNKNOWN), node("cpu-0", Phase.UNKNOWN), stuck, gcs_reachable=False)
    assert run(spec(), seen) == []
