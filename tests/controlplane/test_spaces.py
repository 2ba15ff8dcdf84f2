"""A workspace's state is derived from its cluster's last status, and never from a status older than its spec."""

from __future__ import annotations

from datetime import UTC, datetime

from raypod import spec as spec_mod
from raypod import state
from raypod.controlplane import spaces


def cluster_with_space(generation: int, observed_generation: int) -> tuple[state.ClusterView, spec_mod.SpaceSpec]:
    spec = spec_mod.parse_spec({"name": "lab", "spaces": [{"name": "nb", "owner": "alice"}]})
    space = spec.spaces[0]
    status = state.ClusterStatus(
        phase=state.ClusterPhase.READY,
        nodes=[state.NodeStatus(name=space.node_name(), group="space", phase=state.NodePhase.RUNNING)],
        endpoints={"space/nb": "http://127.0.0.1:1"},
        observed_generation=observed_generation,
    )
    view = state.ClusterView(uid="u1", spec=spec, status=status, generation=generation, created_at=datetime.now(UTC))
    return view, space


def test_a_workspace_whose_ide_answers_on_a_running_node_is_ready() -> None:
    assert spaces._view(*cluster_with_space(3, 3)).state == "Ready"


def test_a_status_older_than_the_spec_is_not_ready_even_if_the_old_node_still_answers() -> None:
    """A stop then a start within one pass: the node still answers, but it is on its way out (seen in e2e)."""
    found = spaces._view(*cluster_with_space(4, 3))
    assert found.state == "Starting" and "not applied" in found.message
