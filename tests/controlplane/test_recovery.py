"""Node recovery through the real loop, store and health monitor, on the in-memory backend whose health checks
run as real shell commands: a failing check replaces a node, a check that always fails hits the flapping guard,
manual recovery only reports, operators replace and cordon, and a restarted server carries a request through."""

from __future__ import annotations

from concurrent import futures
from pathlib import Path

import pytest

from raypod import spec as spec_mod
from raypod import state
from raypod.backends import fake
from raypod.controlplane import loop, store

Phase = state.ClusterPhase


@pytest.fixture
def db(tmp_path: Path) -> store.Store:
    return store.Store(f"sqlite:///{tmp_path / 'raypod.db'}")


def make_spec(tmp_path: Path, **extra: object) -> spec_mod.ClusterSpec:
    # The check fails for a node while a file named after it exists: the test breaks and mends nodes at will.
    check = {
        "name": "marker",
        "command": f"test ! -e {tmp_path}/bad-$RAYPOD_NODE_NAME",
        "period_s": 1,
        "timeout_s": 1,
        "failure_threshold": 1,
    }
    data: dict[str, object] = {
        "name": "demo",
        "worker_groups": [{"name": "cpu", "replicas": 2}],
        "health_checks": [check],
        "recovery": {"drain_timeout_s": 0, "max_replacements": 2, "quarantine_s": 60},
    }
    data.update(extra)
    return spec_mod.parse_spec(data)


def settle(reconciler: loop.Reconciler, passes: int = 8) -> state.ClusterView:
    for _ in range(passes):
        reconciler.reconcile_all()
        # Health checks run in the background: let the ones started in this pass finish.
        checks = [c for per_cluster in list(reconciler.health._checks.values()) for c in list(per_cluster.values())]
        running = [c.running for c in checks if c.running is not None]
        futures.wait(running, timeout=10)
    return reconciler.store.get("default", "demo")


def reasons(db: store.Store) -> list[str]:
    return [event.reason for event in db.events("default", "demo")]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0  # every read is a second later: every check is due on every pass
        return self.now


def reconciler_for(db: store.Store, backend: fake.FakeBackend) -> loop.Reconciler:
    from raypod.capabilities.resilience.monitor import HealthMonitor

    return loop.Reconciler(db, backend, health=HealthMonitor(backend, clock=Clock()))


def test_a_failing_health_check_makes_the_node_unhealthy_and_it_is_replaced(db: store.Store, tmp_path: Path) -> None:
    backend = fake.FakeBackend()
    uid = db.insert(make_spec(tmp_path)).uid
    reconciler = reconciler_for(db, backend)
    view = settle(reconciler)
    assert view.status.phase is Phase.READY
    assert {n.health for n in view.status.nodes} == {state.NodeHealthState.HEALTHY}
    before = backend.nodes[uid]["cpu-1"].incarnation
    (tmp_path / "bad-cpu-1").touch()
    for _ in range(10):
        view = settle(reconciler, passes=1)
        if "RemovedUnhealthyNode" in reasons(db):
            break
    (tmp_path / "bad-cpu-1").unlink()
    view = settle(reconciler)
    assert "NodeUnhealthy" in reasons(db) and "ReplacedNode" in reasons(db)
    unhealthy = next(e for e in db.events("default", "demo") if e.reason == "NodeUnhealthy")
    assert unhealthy.node == "cpu-1" and "check:marker: exit 1" in unhealthy.message
    assert backend.nodes[uid]["cpu-1"].incarnation != before
    assert (uid, "cpu-1", 60.0) in backend.quarantined
    assert view.status.phase is Phase.READY, view.status.message


def test_a_check_that_always_fails_hits_the_flapping_guard(db: store.Store, tmp_path: Path) -> None:
    backend = fake.FakeBackend()
    uid = db.insert(make_spec(tmp_path)).uid
    reconciler = reconciler_for(db, backend)
    settle(reconciler)
    (tmp_path / "bad-cpu-0").touch()
    view = settle(reconciler, passes=30)
    assert reasons(db).count("RemovedUnhealthyNode") == 2, "max_replacements is 2"
    assert reasons(db).count("ReplacementLimitReached") == 1
    assert view.status.phase is Phase.DEGRADED
    assert "group(s) cpu reached 2 replacement(s)" in view.status.message
    held = view.status.condition("ReplacementLimitReached")
    assert held is not None and held.status
    node = next(n for n in view.status.nodes if n.name == "cpu-0")
    assert node.health is state.NodeHealthState.UNHEALTHY and node.health_reasons
    assert "cpu-0" in backend.nodes[uid], "a held node is left as it is, not deleted"
    # An operator can still replace it.
    db.request_node(uid, "cpu-0", store.REPLACE, "ops")
    settle(reconciler, passes=2)
    assert reasons(db).count("RemovedOnRequest") == 1


def test_manual_recovery_reports_an_unhealthy_node_and_leaves_it(db: store.Store, tmp_path: Path) -> None:
    backend = fake.FakeBackend()
    uid = db.insert(make_spec(tmp_path, node_recovery="manual")).uid
    reconciler = reconciler_for(db, backend)
    settle(reconciler)
    calls = list(backend.calls)
    (tmp_path / "bad-cpu-0").touch()
    view = settle(reconciler, passes=6)
    assert backend.calls == calls
    assert view.status.phase is Phase.DEGRADED and "manual recovery: unhealthy node(s) cpu-0" in view.status.message
    event = next(e for e in db.events("default", "demo") if e.reason == "NodeUnhealthy")
    assert "raypod node replace" in event.message
    (tmp_path / "bad-cpu-0").unlink()
    view = settle(reconciler, passes=6)
    assert view.status.phase is Phase.READY and "NodeHealthy" in reasons(db)
    assert backend.calls == calls and uid in backend.nodes


def test_a_cordoned_node_is_held_out_of_recovery_until_uncordoned(db: store.Store, tmp_path: Path) -> None:
    backend = fake.FakeBackend()
    uid = db.insert(make_spec(tmp_path)).uid
    reconciler = reconciler_for(db, backend)
    settle(reconciler)
    db.request_node(uid, "cpu-0", store.CORDON, "ops")
    (tmp_path / "bad-cpu-0").touch()
    view = settle(reconciler, passes=6)
    assert "RemovedUnhealthyNode" not in reasons(db)
    assert next(n for n in view.status.nodes if n.name == "cpu-0").cordoned
    assert db.clear_node_request(uid, "cpu-0", store.CORDON)
    settle(reconciler, passes=6)
    assert "RemovedUnhealthyNode" in reasons(db)


def test_a_replace_request_survives_a_server_restart_and_is_carried_out_once(db: store.Store, tmp_path: Path) -> None:
    backend = fake.FakeBackend()
    uid = db.insert(make_spec(tmp_path, recovery={"drain_timeout_s": 3600})).uid
    settle(reconciler_for(db, backend))
    db.request_node(uid, "cpu-1", store.REPLACE, "ops")
    first = reconciler_for(db, backend)
    settle(first, passes=1)  # bound to the current incarnation, drain started
    assert reasons(db)[-1] == "DrainingOnRequest"
    # The server dies here; a new one (new loop, new health monitor) takes over the same store and backend.
    second = reconciler_for(db, backend)
    view = settle(second, passes=8)
    # The in-memory backend's drained nodes exit by themselves, so the drained node is removed as dead.
    removed = reasons(db).count("RemovedOnRequest") + reasons(db).count("RemovedDeadNode")
    assert removed == 1 and reasons(db).count("DrainingOnRequest") == 1
    assert db.node_requests(uid) == [], "a carried-out request is cleared"
    assert view.status.phase is Phase.READY
    assert [call for call in backend.calls if call[0] == "create" and call[2] == "cpu-1"].__len__() == 2


def test_a_node_that_cannot_be_replaced_leaves_the_cluster_degraded_with_the_reason_not_a_crash_loop(
    db: store.Store, tmp_path: Path
) -> None:
    backend = fake.FakeBackend()
    uid = db.insert(make_spec(tmp_path, health_checks=[])).uid
    reconciler = reconciler_for(db, backend)
    settle(reconciler)
    backend.no_capacity.add("cpu-1")
    backend.kill(uid, "cpu-1")
    view = settle(reconciler, passes=40)
    assert view.status.phase is Phase.DEGRADED
    assert "not enough free memory to start node cpu-1" in view.status.message
    failure = view.status.condition("ReplicaFailure")
    assert failure is not None and failure.status
    # Failed creates back off (1 s, 2 s, ...): 40 passes at full speed try only once or twice.
    assert 1 <= sum(1 for call in backend.calls if call == ("create-refused", uid, "cpu-1")) <= 2
    backend.no_capacity.clear()
    reconciler._failures.clear()  # the backoff has passed
    assert settle(reconciler).status.phase is Phase.READY
