"""The reconcile loop over a real store and the in-memory backend: convergence, node loss, an unreachable GCS,
status derived the same by a restarted server, and backoff after a failed action."""

from __future__ import annotations

from pathlib import Path

import pytest

from raypod import spec as spec_mod
from raypod import state
from raypod.backends import fake
from raypod.controlplane import loop, store

SPEC = spec_mod.parse_spec({"name": "demo", "worker_groups": [{"name": "cpu", "replicas": 2}]})
Phase = state.ClusterPhase


@pytest.fixture
def db(tmp_path: Path) -> store.Store:
    return store.Store(f"sqlite:///{tmp_path / 'raypod.db'}")


def settle(reconciler: loop.Reconciler, passes: int = 6) -> state.ClusterView:
    for _ in range(passes):
        reconciler.reconcile_all()
    return reconciler.store.get("default", "demo")


def reasons(db: store.Store) -> list[str]:
    return [event.reason for event in db.events("default", "demo")]


def test_a_new_cluster_converges_to_ready_with_one_event_per_change(db: store.Store) -> None:
    backend = fake.FakeBackend()
    db.insert(SPEC)
    view = settle(loop.Reconciler(db, backend))
    assert view.status.phase is Phase.READY
    assert [n.name for n in view.status.nodes] == ["head", "cpu-0", "cpu-1"]
    assert reasons(db).count("CreatedWorker") == 2
    assert reasons(db).count("NodeStarted") == 3
    assert reasons(db).count("ClusterReady") == 1


def test_an_unreachable_gcs_deletes_nothing_and_is_reported_once(db: store.Store) -> None:
    backend = fake.FakeBackend()
    uid = db.insert(SPEC).uid
    reconciler = loop.Reconciler(db, backend, settings=loop.plan.PlanSettings(node_start_timeout_s=0.0))
    settle(reconciler)
    calls_before = list(backend.calls)
    backend.set_gcs_reachable(uid, False)
    view = settle(reconciler, passes=5)
    assert view.status.phase is Phase.UNKNOWN
    assert {n.phase for n in view.status.nodes} == {state.NodePhase.UNKNOWN}
    assert backend.calls == calls_before, "an unknown node was touched"
    assert reasons(db).count("GCSUnreachable") == 1
    backend.set_gcs_reachable(uid, True)
    view = settle(reconciler, passes=2)
    assert view.status.phase is Phase.READY
    assert backend.calls == calls_before
    assert reasons(db).count("GCSReachable") == 1
    assert "NodeDied" not in reasons(db)


def test_gcs_unreachable_beyond_the_bound_becomes_a_condition_and_an_event(db: store.Store) -> None:
    backend = fake.FakeBackend()
    uid = db.insert(SPEC).uid
    reconciler = loop.Reconciler(db, backend, gcs_unreachable_timeout_s=0.0)
    settle(reconciler)
    backend.set_gcs_reachable(uid, False)
    view = settle(reconciler, passes=3)
    condition = view.status.condition("GCSReachable")
    assert condition is not None and condition.reason == "GCSUnreachableTooLong"
    assert reasons(db).count("GCSUnreachableTooLong") == 1


def test_a_lost_node_degrades_the_cluster_also_for_a_restarted_server(db: store.Store) -> None:
    backend = fake.FakeBackend()
    uid = db.insert(SPEC).uid
    settle(loop.Reconciler(db, backend))
    backend.kill(uid, "cpu-1")
    backend.held_starting.add("cpu-1")
    first = loop.Reconciler(db, backend)
    first.reconcile_all()  # removes and recreates cpu-1: it is Starting now
    assert db.get("default", "demo").status.phase is Phase.DEGRADED
    # A new server with the same store and no memory of the last pass derives the same phase.
    db.save_status(uid, state.ClusterStatus())
    restarted = loop.Reconciler(db, backend)
    restarted.reconcile_all()
    assert db.get("default", "demo").status.phase is Phase.DEGRADED
    backend.held_starting.clear()
    assert settle(restarted).status.phase is Phase.READY
    assert {"NodeDied", "RemovedDeadNode", "ReplacedNode"} <= set(reasons(db))


def test_a_failed_action_backs_the_cluster_off_then_recovers(db: store.Store) -> None:
    backend = fake.FakeBackend()
    uid = db.insert(SPEC).uid
    backend.fail_next_create = "head"
    reconciler = loop.Reconciler(db, backend)
    reconciler.reconcile_all()
    assert "FailedToCreateNode" in reasons(db)
    assert uid in reconciler._failures
    reconciler.reconcile_all()  # still backing off: nothing tried
    assert reasons(db).count("CreatedHead") == 0
    reconciler._failures.clear()
    assert settle(reconciler).status.phase is Phase.READY


def test_a_changed_cluster_is_reconciled_before_the_rest_and_settled_ones_are_not_replanned(
    db: store.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = fake.FakeBackend()
    for name in ["a", "b", "c"]:
        db.insert(spec_mod.parse_spec({"name": name, "worker_groups": [{"name": "cpu", "replicas": 1}]}))
    reconciler = loop.Reconciler(db, backend)
    for _ in range(4):
        reconciler.reconcile_all()
    planned: list[str] = []
    real_plan = loop.plan.plan
    monkeypatch.setattr(
        loop.plan, "plan", lambda desired, *a, **k: planned.append(desired.name) or real_plan(desired, *a, **k)
    )
    reconciler.reconcile_all()
    assert planned == [], "settled clusters with nothing new were planned again"

    c = db.get("default", "c")
    db.update_spec(c.uid, c.spec.with_replicas("cpu", 2))
    reconciler.wake(c.uid)
    reconciler.reconcile_all()
    assert planned[0] == "c" and planned.count("c") == 1, planned
    assert ("create", c.uid, "cpu-1") in backend.calls

    backend.kill(c.uid, "cpu-0")  # an observation that changed: planned again without a wake
    planned.clear()
    reconciler.reconcile_all()
    assert planned == ["c"]


def test_on_a_backend_that_reports_changes_a_settled_cluster_is_observed_only_when_told(db: store.Store) -> None:
    features = frozenset({loop.base.Feature.DRAIN, loop.base.Feature.CHANGE_EVENTS})
    backend = fake.FakeBackend(features=features)
    uid = db.insert(SPEC).uid
    reconciler = loop.Reconciler(db, backend)
    settle(reconciler)
    observed: list[str] = []
    real_observe = backend.observe
    backend.observe = lambda cluster_id: observed.append(cluster_id) or real_observe(cluster_id)  # type: ignore[method-assign]
    settle(reconciler, passes=3)
    assert observed == [], "a settled cluster was observed with nothing reported"

    backend.kill(uid, "cpu-0")  # the backend reports it: the next pass looks, replaces the node
    view = settle(reconciler, passes=4)
    assert observed and view.status.phase is Phase.READY
    assert reasons(db).count("RemovedDeadNode") == 1
