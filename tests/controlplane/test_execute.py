"""The executor: order, batches, the stop at the first failed batch, and one event per action."""

from __future__ import annotations

import threading

from raypod import actions, errors, state
from raypod import spec as spec_mod
from raypod.backends import fake
from raypod.controlplane import execute

SPEC = spec_mod.parse_spec({"name": "demo", "worker_groups": [{"name": "cpu", "replicas": 3}]})


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[state.EventType, str, str | None]] = []
        self._lock = threading.Lock()

    def __call__(self, kind: state.EventType, reason: str, message: str, node: str | None) -> None:
        with self._lock:
            self.events.append((kind, reason, node))


def creates(*names: str) -> list[actions.Action]:
    nodes = {node.name: node for node in SPEC.desired_nodes()}
    return [actions.CreateNode(nodes[name], "CreatedWorker", f"node {name}") for name in names]


def test_every_action_is_applied_and_recorded_once() -> None:
    backend, record = fake.FakeBackend(), Recorder()
    planned = [actions.DeleteNode("old", "RemovedDeadNode", "died"), *creates("cpu-0", "cpu-1")]
    outcomes = execute.execute(planned, backend, "c1", record)
    assert [o.error for o in outcomes] == [None, None, None]
    assert backend.calls[0] == ("delete", "c1", "old")
    assert sorted(backend.calls[1:]) == [("create", "c1", "cpu-0"), ("create", "c1", "cpu-1")]
    assert (state.EventType.WARNING, "RemovedDeadNode", "old") in record.events
    assert sorted(e[2] or "" for e in record.events if e[1] == "CreatedWorker") == ["cpu-0", "cpu-1"]


def test_a_failed_batch_stops_the_pass_and_is_recorded_as_failed_to() -> None:
    backend, record = fake.FakeBackend(), Recorder()
    backend.fail_next_create = "cpu-1"
    planned = [*creates("cpu-0", "cpu-1"), actions.DeleteNode("cpu-2", "DeletedNode", "scaled down")]
    outcomes = execute.execute(planned, backend, "c1", record)
    assert len(outcomes) == 2, "the delete after the failed create batch must not run"
    failed = [o for o in outcomes if o.error is not None]
    assert [o.reason for o in failed] == ["FailedToCreateNode"]
    assert isinstance(failed[0].error, errors.TransientError) and not failed[0].is_permanent
    assert ("delete", "c1", "cpu-2") not in backend.calls
    assert (state.EventType.WARNING, "FailedToCreateNode", "cpu-1") in record.events


def test_consecutive_creates_run_concurrently() -> None:
    started, release = threading.Barrier(3, timeout=5), threading.Event()

    class Slow(fake.FakeBackend):
        def create_node(self, cluster_id: str, node: spec_mod.NodeSpec) -> None:
            started.wait()  # all three must be inside create_node at once, or this times out
            super().create_node(cluster_id, node)

    outcomes = execute.execute(creates("cpu-0", "cpu-1", "cpu-2"), Slow(), "c1", Recorder())
    release.set()
    assert [o.error for o in outcomes] == [None, None, None]


def test_an_action_that_cannot_run_yet_is_no_failure_and_no_event() -> None:
    """A sidecar of a node whose processes are still starting: asked again next pass, nothing recorded, and the
    actions after it still run."""

    class StartingBackend(fake.FakeBackend):
        def start_sidecar(self, cluster_id: str, node: str, sidecar: str) -> None:
            raise errors.NotYet(f"node {node} is still starting")

    backend, record = StartingBackend(), Recorder()
    planned = [actions.StartSidecar("cpu-0", "ide", "StartedSidecar", "ide of node cpu-0"), *creates("cpu-1")]
    outcomes = execute.execute(planned, backend, "c1", record)
    assert not outcomes[0].failed and isinstance(outcomes[0].error, errors.NotYet)
    assert [e[1] for e in record.events] == ["CreatedWorker"]
