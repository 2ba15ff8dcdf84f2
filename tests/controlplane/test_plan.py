"""Table tests of the pure planner."""

from __future__ import annotations

from raypod import actions, state
from raypod import spec as spec_mod
from raypod.backends import base
from raypod.capabilities.resilience.model import Verdict
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


# -- node recovery ---------------------------------------------------------------------------------------------

ANSWERS = Verdict(reason="check:fs: exit 1", answers=True)
FROZEN = Verdict(reason="agent: no answer", answers=False)


def recovery(**fields: object) -> plan.Recovery:
    return plan.Recovery(**fields)  # type: ignore[arg-type]


def manual() -> spec_mod.ClusterSpec:
    return spec_mod.parse_spec(
        {"name": "demo", "worker_groups": [{"name": "cpu", "replicas": 2}], "node_recovery": "manual"}
    )


HEALTHY_CLUSTER = observed(node("head"), node("cpu-0"), node("cpu-1"))


def test_an_unhealthy_node_that_answers_is_drained_then_replaced_once_the_drain_ends() -> None:
    planned = plan.plan(
        spec(),
        HEALTHY_CLUSTER,
        deleting=False,
        now=NOW,
        features=DRAIN,
        recovery=recovery(unhealthy={"cpu-1": ANSWERS}),
    )
    assert summary(planned) == [("DrainNode", "cpu-1", "DrainingUnhealthyNode")]
    assert isinstance(planned[0], actions.DrainNode) and planned[0].deadline == NOW + 10
    draining = observed(node("head"), node("cpu-0"), node("cpu-1", Phase.DRAINING, drain_deadline=NOW + 5))
    assert run(spec(), draining, recovery=recovery(unhealthy={"cpu-1": ANSWERS})) == []
    drained = observed(node("head"), node("cpu-0"), node("cpu-1", Phase.DRAINING, drain_deadline=NOW - 1))
    planned = plan.plan(
        spec(), drained, deleting=False, now=NOW, features=DRAIN, recovery=recovery(unhealthy={"cpu-1": ANSWERS})
    )
    assert summary(planned) == [
        ("DeleteNode", "cpu-1", "RemovedUnhealthyNode"),
        ("CreateNode", "cpu-1", "ReplacedNode"),
    ]
    delete = planned[0]
    assert isinstance(delete, actions.DeleteNode) and delete.quarantine_s == 300.0


def test_a_frozen_node_is_not_drained_it_is_replaced_at_once() -> None:
    assert run(spec(), HEALTHY_CLUSTER, recovery=recovery(unhealthy={"cpu-0": FROZEN})) == [
        ("DeleteNode", "cpu-0", "RemovedUnhealthyNode"),
        ("CreateNode", "cpu-0", "ReplacedNode"),
    ]


def test_without_drain_support_or_a_zero_drain_timeout_an_unhealthy_node_is_replaced_at_once() -> None:
    assert run(spec(), HEALTHY_CLUSTER, features=frozenset(), recovery=recovery(unhealthy={"cpu-0": ANSWERS}))[0] == (
        "DeleteNode",
        "cpu-0",
        "RemovedUnhealthyNode",
    )
    no_drain = spec_mod.parse_spec(
        {"name": "demo", "worker_groups": [{"name": "cpu", "replicas": 2}], "recovery": {"drain_timeout_s": 0}}
    )
    assert (
        run(no_drain, HEALTHY_CLUSTER, recovery=recovery(unhealthy={"cpu-0": ANSWERS}))[0][2] == "RemovedUnhealthyNode"
    )


def test_manual_recovery_touches_no_unhealthy_node_but_an_operator_request_replaces_it() -> None:
    assert run(manual(), HEALTHY_CLUSTER, recovery=recovery(unhealthy={"cpu-0": FROZEN})) == []
    assert run(manual(), HEALTHY_CLUSTER, recovery=recovery(replace_requested=frozenset({"cpu-0"}))) == [
        ("DrainNode", "cpu-0", "DrainingOnRequest")
    ]
    late = observed(node("head"), node("cpu-0", Phase.DRAINING, drain_deadline=NOW - 1), node("cpu-1"))
    assert run(manual(), late, recovery=recovery(replace_requested=frozenset({"cpu-0"}))) == [
        ("DeleteNode", "cpu-0", "RemovedOnRequest"),
        ("CreateNode", "cpu-0", "ReplacedNode"),
    ]


def test_a_dead_node_is_replaced_in_both_modes_with_its_slot_quarantined() -> None:
    dead = observed(node("head"), node("cpu-0", Phase.DEAD, reason="node process exited"), node("cpu-1"))
    for desired in (spec(), manual()):
        planned = plan.plan(desired, dead, deleting=False, now=NOW, features=DRAIN)
        assert summary(planned) == [("DeleteNode", "cpu-0", "RemovedDeadNode"), ("CreateNode", "cpu-0", "ReplacedNode")]
        assert isinstance(planned[0], actions.DeleteNode) and planned[0].quarantine_s == 300.0


def test_a_group_at_its_replacement_limit_is_left_as_it_is_unless_an_operator_asks() -> None:
    dead = observed(node("head"), node("cpu-0", Phase.DEAD), node("cpu-1"))
    held = frozenset({"cpu"})
    assert run(spec(), dead, recovery=recovery(held_groups=held, unhealthy={"cpu-1": FROZEN})) == []
    assert run(spec(), dead, recovery=recovery(held_groups=held, replace_requested=frozenset({"cpu-0"})))[0] == (
        "DeleteNode",
        "cpu-0",
        "RemovedOnRequest",
    )
    # Another group's limit does not hold this one.
    assert run(spec(), dead, recovery=recovery(held_groups=frozenset({"headgroup"})))[0][2] == "RemovedDeadNode"


def test_a_cordoned_node_is_left_alone_even_when_it_is_dead() -> None:
    dead = observed(node("head"), node("cpu-0", Phase.DEAD), node("cpu-1"))
    cordoned = frozenset({"cpu-0", "cpu-1"})
    assert run(spec(), dead, recovery=recovery(cordoned=cordoned, unhealthy={"cpu-1": FROZEN})) == []


def test_an_unknown_node_is_never_recovered_whatever_the_verdict_or_request() -> None:
    unknown = observed(
        node("head", Phase.UNKNOWN), node("cpu-0", Phase.UNKNOWN), node("cpu-1", Phase.UNKNOWN), gcs_reachable=False
    )
    assert (
        run(spec(), unknown, recovery=recovery(unhealthy={"cpu-0": FROZEN}, replace_requested=frozenset({"cpu-1"})))
        == []
    )


def test_invalid_recovery_settings_are_refused_with_the_field_named() -> None:
    import pytest

    from raypod import errors

    for bad, field in [
        ({"recovery": {"window_s": -1}}, "recovery.window_s"),
        ({"recovery": {"max_replacements": 0}}, "recovery.max_replacements"),
        ({"recovery": {"probe_failure_threshold": 0}}, "recovery.probe_failure_threshold"),
        ({"node_recovery": "sometimes"}, "node_recovery"),
        (
            {"health_checks": [{"name": "x", "command": "true", "failure_threshold": 0}]},
            "health_checks.0.failure_threshold",
        ),
        ({"health_checks": [{"name": "x", "command": "true", "period_s": 5, "timeout_s": 10}]}, "health_checks.0"),
        ({"health_checks": [{"name": "x", "command": "true"}, {"name": "x", "command": "false"}]}, "(spec)"),
    ]:
        with pytest.raises(errors.InvalidSpec) as raised:
            spec_mod.parse_spec({"name": "demo", **bad})
        assert field in str(raised.value) or field == "(spec)", (bad, str(raised.value))


def test_an_unhealthy_head_replaced_without_gcs_fault_tolerance_restarts_the_workers_with_it() -> None:
    frozen_head = recovery(unhealthy={"head": FROZEN})
    assert run(spec(), HEALTHY_CLUSTER, recovery=frozen_head) == [
        ("DeleteNode", "cpu-0", "RestartedWithHead"),
        ("DeleteNode", "cpu-1", "RestartedWithHead"),
        ("DeleteNode", "head", "RemovedUnhealthyNode"),
        ("CreateNode", "head", "ReplacedNode"),
    ]
    assert run(spec(fault_tolerant=True), HEALTHY_CLUSTER, recovery=frozen_head) == [
        ("DeleteNode", "head", "RemovedUnhealthyNode"),
        ("CreateNode", "head", "ReplacedNode"),
    ]


def test_a_preempted_clusters_head_runs_until_its_grace_ends_its_workers_are_drained() -> None:
    seen = observed(node("head"), node("cpu-0"))
    during = plan.park(seen, now=NOW, features=DRAIN, grace_until=NOW + 30)
    assert summary(during) == [("DrainNode", "cpu-0", "DrainedNode")]
    assert plan.park(observed(node("head")), now=NOW + 29, features=DRAIN, grace_until=NOW + 30) == []
    after = plan.park(observed(node("head")), now=NOW + 30, features=DRAIN, grace_until=NOW + 30)
    assert summary(after) == [("DeleteNode", "head", "DeletedNode")]
    # A head that is not running has nothing to save: no grace.
    dead = plan.park(observed(node("head", Phase.DEAD)), now=NOW, features=DRAIN, grace_until=NOW + 30)
    assert summary(dead) == [("DeleteNode", "head", "DeletedNode")]


def test_sidecars_of_live_nodes_are_started_and_restarted_by_actions_and_no_others() -> None:
    """observe only reports a sidecar that does not run; the plan starts it (a kubelet restarting a container)."""
    Sidecar = state.SidecarState
    seen = observed(
        node("head", sidecars={"hangwatch-agent": Sidecar.RUNNING}),
        node("cpu-0", Phase.STARTING, sidecars={"hangwatch-agent": Sidecar.NOT_STARTED}),
        node("cpu-1", sidecars={"hangwatch-agent": Sidecar.EXITED, "ide": Sidecar.NOT_STARTED}),
    )
    planned = plan.plan(spec(), seen, deleting=False, now=NOW, features=DRAIN)
    assert summary(planned) == [
        ("StartSidecar", "cpu-0", "StartedSidecar"),
        ("StartSidecar", "cpu-1", "RestartedSidecar"),
        ("StartSidecar", "cpu-1", "StartedSidecar"),
    ]
    assert [a.sidecar for a in planned if isinstance(a, actions.StartSidecar)] == [
        "hangwatch-agent",
        "hangwatch-agent",
        "ide",
    ]
    # Not for a node on its way out (draining, scaled away) nor for a cluster being deleted.
    leaving = observed(
        node("head"),
        node("cpu-0", sidecars={"ide": Sidecar.NOT_STARTED}),
        node("cpu-1", Phase.DRAINING, sidecars={"ide": Sidecar.EXITED}),
    )
    assert [r for r in run(spec(replicas=1), leaving) if r[0] == "StartSidecar"] == [
        ("StartSidecar", "cpu-0", "StartedSidecar")
    ]
    assert [r for r in run(spec(), leaving, deleting=True) if r[0] == "StartSidecar"] == []


def test_a_nodes_files_are_deleted_only_once_it_is_neither_wanted_nor_seen_and_before_the_cluster_is_released() -> None:
    files = plan.Recovery(delete_files={"cpu-1": "/files/nb"})
    deleted = ("DeleteFiles", "cpu-1", "SpaceFilesDeleted")
    unknown = node("cpu-1", Phase.UNKNOWN)
    assert deleted not in run(spec(1), observed(node("head"), node("cpu-0"), unknown), recovery=files)
    assert deleted not in run(spec(1), observed(node("head"), node("cpu-0"), node("cpu-1")), recovery=files)
    assert deleted not in run(spec(2), observed(node("head"), node("cpu-0")), recovery=files), "wanted again"
    assert run(spec(1), observed(node("head"), node("cpu-0")), recovery=files) == [deleted]
    assert run(spec(), observed(unknown), deleting=True, recovery=files) == [("DeleteNode", "cpu-1", "DeletedNode")]
    last = run(spec(), observed(), deleting=True, recovery=files)
    assert last == [deleted, ("ReleaseCluster", "", "Deleted")]
    parked = plan.park(observed(node("head", Phase.STARTING)), now=NOW, features=DRAIN, delete_files={"cpu-1": "/f"})
    assert summary(parked) == [("DeleteNode", "head", "DeletedNode"), deleted]
