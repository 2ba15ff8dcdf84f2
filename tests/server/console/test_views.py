"""The console's pure read views."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from raypod import spec as spec_mod
from raypod import state
from raypod.server.console import views

NOW = datetime(2026, 12, 3, tzinfo=UTC)


@pytest.mark.parametrize(
    ("seconds", "shown"), [(-5, "0s"), (0, "0s"), (59, "59s"), (60, "1m"), (3599, "59m"), (7200, "2h"), (90000, "1d")]
)
def test_age_reads_like_kubectl(seconds: int, shown: str) -> None:
    assert views.age(NOW - timedelta(seconds=seconds), NOW) == shown


def view(namespace: str = "default", nodes: list[state.NodeStatus] | None = None) -> state.ClusterView:
    spec = spec_mod.parse_spec(
        {"name": "demo", "namespace": namespace, "worker_groups": [{"name": "cpu", "replicas": 1, "memory": "2Gi"}]}
    )
    return state.ClusterView(
        uid="u", spec=spec, status=state.ClusterStatus(nodes=nodes or []), generation=1, created_at=NOW
    )


def test_node_rows_show_desired_nodes_pending_and_nodes_being_removed() -> None:
    running = state.NodeStatus(name="head", group="headgroup", phase=state.NodePhase.RUNNING, is_head=True, pid=7)
    leaving = state.NodeStatus(name="cpu-1", group="cpu", phase=state.NodePhase.DRAINING)
    rows = {row.name: row for row in views.node_rows(view(nodes=[running, leaving]))}
    assert (rows["head"].phase, rows["head"].pid, rows["head"].memory) == ("Running", 7, "1Gi")
    assert (rows["cpu-0"].phase, rows["cpu-0"].memory) == ("Pending", "2Gi")
    assert (rows["cpu-1"].phase, rows["cpu-1"].reason) == ("Draining", "being removed")


def test_addresses_leave_out_the_default_namespace() -> None:
    assert views.address(view()) == "raypod://demo"
    assert views.address(view("team-a")) == "raypod://demo/team-a"
    assert 'JobSubmissionClient("raypod://demo/team-a")' in views.snippets(view("team-a"))["JobSubmissionClient"]
