"""Service discovery targets from cluster views. Pure."""

from __future__ import annotations

from datetime import UTC, datetime

from raypod import spec as spec_mod
from raypod import state
from raypod.capabilities.observability import discovery

NOW = datetime(2026, 12, 3, tzinfo=UTC)


def node(name: str, phase: state.NodePhase, endpoint: str | None, group: str = "cpu") -> state.NodeStatus:
    return state.NodeStatus(
        name=name, group=group, phase=phase, is_head=name == "head", ray_node_id=f"id-{name}", metrics_endpoint=endpoint
    )


def view(
    name: str, nodes: list[state.NodeStatus], namespace: str = "default", deleting: bool = False
) -> state.ClusterView:
    return state.ClusterView(
        uid=name,
        spec=spec_mod.ClusterSpec(name=name, namespace=namespace),
        status=state.ClusterStatus(nodes=nodes),
        generation=1,
        created_at=NOW,
        deleting=deleting,
    )


def test_every_alive_node_is_a_target_labelled_with_its_cluster() -> None:
    views = [
        view(
            "b",
            [
                node("head", state.NodePhase.RUNNING, "10.0.0.1:9001", group="headgroup"),
                node("cpu-0", state.NodePhase.DRAINING, "10.0.0.1:9002"),
                node("cpu-1", state.NodePhase.DEAD, "10.0.0.1:9003"),
                node("cpu-2", state.NodePhase.STARTING, None),
            ],
            namespace="team-a",
        ),
        view("a", [node("head", state.NodePhase.RUNNING, "10.0.0.1:9100", group="headgroup")]),
        view("gone", [node("head", state.NodePhase.RUNNING, "10.0.0.1:9200")], deleting=True),
    ]
    groups = discovery.ray_targets(views)
    assert [g["targets"] for g in groups] == [["10.0.0.1:9100"], ["10.0.0.1:9001"], ["10.0.0.1:9002"]]
    assert groups[1]["labels"] == {
        "ray_io_cluster": "b",
        "namespace": "team-a",
        "node_group": "headgroup",
        "node": "head",
        "node_id": "id-head",
        "role": "head",
    }
    assert groups[2]["labels"]["role"] == "worker"


def test_raypod_itself_is_one_target() -> None:
    assert discovery.raypod_targets("127.0.0.1:8471") == [
        {"targets": ["127.0.0.1:8471"], "labels": {"service": "raypod"}}
    ]
