from __future__ import annotations

from datetime import UTC, datetime, timedelta

from raypod import actions, errors, state
from raypod import spec as spec_mod
from raypod.controlplane import execute, status

T0 = datetime(2026, 1, 1, tzinfo=UTC)
Phase = state.NodePhase
SPEC = spec_mod.parse_spec({"name": "demo", "worker_groups": [{"name": "cpu", "replicas": 1}]})


def seen(gcs_reachable: bool = True, **phases: Phase) -> state.ObservedCluster:
    return state.ObservedCluster(
        nodes={
            name: state.ObservedNode(name, "cpu", name == "head", phase, started_at=0.0)
            for name, phase in phases.items()
        },
        gcs_reachable=gcs_reachable,
        gcs_error="" if gcs_reachable else "timed out",
    )


def derive(
    observed: state.ObservedCluster,
    previous: state.ClusterStatus | None = None,
    outcomes: list[execute.Outcome] | None = None,
    now: datetime = T0,
    deleting: bool = False,
    replacing: frozenset[str] = frozenset(),
) -> state.ClusterStatus:
    return status.derive_status(
        SPEC,
        observed,
        outcomes or [],
        deleting=deleting,
        generation=3,
        previous=previous or state.ClusterStatus(),
        now=now,
        replacing=replacing,
        gcs_unreachable_timeout_s=60,
    )


def test_ready_when_every_desired_node_runs() -> None:
    result = derive(seen(head=Phase.RUNNING, **{"cpu-0": Phase.RUNNING}))
    assert result.phase is state.ClusterPhase.READY
    assert (result.ready_nodes, result.desired_nodes, result.observed_generation) == (2, 2, 3)
    assert result.condition("HeadReady").status  # type: ignore[union-attr]


def test_provisioning_while_nodes_start_and_while_surplus_nodes_drain() -> None:
    assert derive(seen(head=Phase.STARTING)).phase is state.ClusterPhase.PROVISIONING
    draining = derive(seen(head=Phase.RUNNING, **{"cpu-0": Phase.RUNNING, "cpu-1": Phase.DRAINING}))
    assert draining.phase is state.ClusterPhase.PROVISIONING
    assert "removing cpu-1" in draining.message


def test_degraded_while_a_lost_node_is_replaced_until_it_is_back() -> None:
    lost = derive(seen(head=Phase.RUNNING, **{"cpu-0": Phase.DEAD}), replacing=frozenset({"cpu-0"}))
    assert lost.phase is state.ClusterPhase.DEGRADED
    replacing = derive(seen(head=Phase.RUNNING, **{"cpu-0": Phase.STARTING}), replacing=frozenset({"cpu-0"}))
    assert replacing.phase is state.ClusterPhase.DEGRADED
    back = derive(seen(head=Phase.RUNNING, **{"cpu-0": Phase.RUNNING}), replacing=frozenset({"cpu-0"}))
    assert back.phase is state.ClusterPhase.READY


def test_status_is_computed_from_observation_and_events_not_from_the_previous_status() -> None:
    """A restarted server (no previous status) shows the same phase as one that watched the node die."""
    observation = seen(head=Phase.RUNNING, **{"cpu-0": Phase.STARTING})
    degraded_before = state.ClusterStatus(phase=state.ClusterPhase.DEGRADED)
    fresh = derive(observation, replacing=frozenset({"cpu-0"}))
    watched = derive(observation, previous=degraded_before, replacing=frozenset({"cpu-0"}))
    assert fresh.phase is watched.phase is state.ClusterPhase.DEGRADED
    # A first start is provisioning, whatever the previous status said.
    assert derive(observation, previous=degraded_before).phase is state.ClusterPhase.PROVISIONING


def test_unreachable_gcs_is_unknown_with_a_condition_that_escalates_after_the_bound() -> None:
    up = derive(seen(head=Phase.RUNNING, **{"cpu-0": Phase.RUNNING}), now=T0)
    blind = seen(False, head=Phase.UNKNOWN, **{"cpu-0": Phase.UNKNOWN})
    first = derive(blind, previous=up, now=T0 + timedelta(seconds=1))
    assert first.phase is state.ClusterPhase.UNKNOWN
    assert "2 node(s) unknown" in first.message
    condition = first.condition("GCSReachable")
    assert condition is not None and not condition.status and condition.reason == "GCSNotAnswering"
    later = derive(blind, previous=first, now=T0 + timedelta(seconds=62))
    condition = later.condition("GCSReachable")
    assert condition is not None and condition.reason == "GCSUnreachableTooLong"
    assert condition.last_transition == T0 + timedelta(seconds=1)
    again = derive(seen(head=Phase.RUNNING, **{"cpu-0": Phase.RUNNING}), previous=later, now=T0 + timedelta(seconds=63))
    assert again.phase is state.ClusterPhase.READY and again.condition("GCSReachable").status  # type: ignore[union-attr]


def test_permanent_failure_fails_the_cluster_and_sets_replica_failure() -> None:
    create = actions.CreateNode(SPEC.desired_nodes()[1], "CreatedWorker", "x")
    failed = derive(seen(head=Phase.RUNNING), outcomes=[execute.Outcome(create, errors.PermanentError("no gpus"))])
    assert failed.phase is state.ClusterPhase.FAILED
    condition = failed.condition("ReplicaFailure")
    assert condition is not None and condition.status and condition.reason == "FailedToCreateNode"


def test_condition_keeps_its_transition_time_while_unchanged() -> None:
    first = derive(seen(head=Phase.RUNNING), now=T0)
    later = derive(seen(head=Phase.RUNNING), previous=first, now=T0 + timedelta(minutes=5))
    assert later.condition("HeadReady").last_transition == T0  # type: ignore[union-attr]
    dead = derive(seen(head=Phase.DEAD), previous=later, now=T0 + timedelta(minutes=6))
    assert dead.condition("HeadReady").last_transition == T0 + timedelta(minutes=6)  # type: ignore[union-attr]


def test_deleting_wins() -> None:
    assert derive(seen(head=Phase.RUNNING), deleting=True).phase is state.ClusterPhase.DELETING
