"""A GCS that stops answering must not look like nodes that never started (issue 11, item 1).

A real server with a short node start timeout runs a real cluster older than that timeout; its ``gcs_server``
is SIGSTOPped for longer than raypod's GCS call timeout, then SIGCONTed. No node may be deleted or restarted,
and the outage is an event and a condition, not a silent mass delete.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import pytest

from raypod import state
from raypod.testing import free_port
from tests.e2e.conftest import RaypodServer, cluster_processes

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]

START_TIMEOUT_S = 20
SPEC = {
    "name": "blind",
    "head": {"cpus": 1, "object_store_memory": "80Mi", "memory": "512Mi"},
    "worker_groups": [{"name": "cpu", "replicas": 1, "cpus": 1, "object_store_memory": "80Mi", "memory": "512Mi"}],
}
DESTRUCTIVE = {"DeletedNode", "NodeStartTimedOut", "RemovedDeadNode", "ReplacedNode", "RestartedWithHead", "NodeDied"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RaypodServer]:
    started = RaypodServer(
        tmp_path_factory.mktemp("raypod-blind"),
        free_port(),
        extra_env={"RAYPOD_NODE_START_TIMEOUT_S": str(START_TIMEOUT_S), "RAYPOD_GCS_UNREACHABLE_TIMEOUT_S": "3"},
    )
    started.start()
    try:
        yield started
    finally:
        with started.client() as api:
            api.clusters.delete("blind")
            api.clusters.wait_deleted("blind", timeout=60)
        started.stop()


def wait_until(check: object, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)


def test_a_stopped_gcs_deletes_and_restarts_nothing(server: RaypodServer) -> None:
    with server.client() as api:
        api.clusters.create(SPEC)
        ready = api.clusters.wait_ready("blind", timeout=180)
        pids = {node.name: node.pid for node in ready.status.nodes}
        age = time.time() - ready.created_at.timestamp()
        if age < START_TIMEOUT_S + 2:
            time.sleep(START_TIMEOUT_S + 2 - age)  # the cluster must be older than the start timeout

        gcs = [p for p in cluster_processes(ready.uid) if p.name() == "gcs_server"]
        assert len(gcs) == 1
        gcs[0].send_signal(signal.SIGSTOP)
        try:
            wait_until(lambda: api.clusters.get("blind").status.phase is state.ClusterPhase.UNKNOWN, "Unknown")
            # Longer than the GCS call timeout several times over, and than the GCS-unreachable bound.
            wait_until(
                lambda: "GCSUnreachableTooLong" in [e.reason for e in api.clusters.events("blind")],
                "the unreachable-too-long event",
            )
            blind = api.clusters.get("blind")
            assert {n.phase for n in blind.status.nodes} == {state.NodePhase.UNKNOWN}
            condition = blind.status.condition("GCSReachable")
            assert condition is not None and not condition.status
            assert condition.reason == "GCSUnreachableTooLong"
        finally:
            gcs[0].send_signal(signal.SIGCONT)

        wait_until(lambda: api.clusters.get("blind").status.phase is state.ClusterPhase.READY, "Ready again")
        after = api.clusters.get("blind")
        assert {node.name: node.pid for node in after.status.nodes} == pids, "a node was restarted"
        reasons = [event.reason for event in api.clusters.events("blind")]
        assert not DESTRUCTIVE & set(reasons), reasons
        assert reasons.count("GCSUnreachable") == 1 and reasons.count("GCSReachable") == 1
