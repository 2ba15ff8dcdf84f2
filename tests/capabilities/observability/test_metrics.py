"""raypod's own metrics: the exposition a scrape gets, and bounded label values."""

from __future__ import annotations

from datetime import UTC, datetime

from prometheus_client.parser import text_string_to_metric_families

from raypod import spec as spec_mod
from raypod import state
from raypod.capabilities.observability import metrics


def test_exposition_counts_clusters_and_nodes_by_phase() -> None:
    running = state.NodeStatus(name="head", group="headgroup", phase=state.NodePhase.RUNNING, is_head=True)
    dead = state.NodeStatus(name="cpu-0", group="cpu", phase=state.NodePhase.DEAD)
    views = [
        state.ClusterView(
            uid="u1",
            spec=spec_mod.ClusterSpec(name="a", owner="alice"),
            status=state.ClusterStatus(phase=state.ClusterPhase.DEGRADED, nodes=[running, dead], desired_nodes=2),
            generation=1,
            created_at=datetime(2026, 1, 1, tzinfo=UTC),
        )
    ]
    metrics.count_node_event("a", "default", "ReplacedNode")
    metrics.count_node_event("a", "default", "Scaled")  # not a node lifecycle event
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(metrics.exposition(lambda: views).decode())
        for sample in family.samples
    }
    assert samples[("raypod_clusters", (("phase", "Degraded"),))] == 1
    assert samples[("raypod_clusters", (("phase", "Ready"),))] == 0
    key = (("namespace", "default"), ("phase", "Dead"), ("ray_io_cluster", "a"))
    assert samples[("raypod_nodes", key)] == 1
    assert samples[("raypod_nodes_desired", (("namespace", "default"), ("ray_io_cluster", "a")))] == 2
    replaced = (("kind", "replaced"), ("namespace", "default"), ("ray_io_cluster", "a"))
    assert samples[("raypod_node_events_total", replaced)] >= 1
    assert not any(name == "raypod_node_events_total" and ("kind", "Scaled") in labels for name, labels in samples)


def test_gateway_routes_are_a_bounded_set() -> None:
    assert metrics.gateway_route("api/jobs/raysubmit_123/logs") == "api/jobs"
    assert metrics.gateway_route("api/version") == "api/version"
    assert metrics.gateway_route("") == "ui"
    assert metrics.gateway_route("static/js/main.abc.js") == "ui"
    assert metrics.gateway_route("api/../../etc") == "ui"
