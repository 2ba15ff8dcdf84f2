"""Dashboards derived from Ray's own generator: every one filterable by cluster, provisioning files that Grafana
reads, and expressions resolved as Grafana would send them. (Prometheus itself accepts them: tests/e2e.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from raypod import errors
from raypod.capabilities.observability import dashboards

Dashboards = dict[str, dict[str, Any]]


@pytest.fixture(scope="module")
def everything() -> Dashboards:
    return dashboards.all_dashboards()


def test_core_data_train_serve_and_overview_are_there_with_ray_uids(everything: Dashboards) -> None:
    titles = {stem: d["title"] for stem, d in everything.items()}
    assert titles == {
        "ray-core": "Ray Core",
        "ray-data": "Ray Data",
        "ray-train": "Ray Train",
        "ray-serve": "Ray Serve",
        "ray-serve-deployments": "Ray Serve Deployments",
        "raypod-overview": "raypod overview",
    }
    # Ray's own uids: the Ray dashboard's embedded Grafana panels point at them.
    assert everything["ray-core"]["uid"] == "rayDefaultDashboard"
    assert everything["ray-train"]["uid"] == "rayTrainDashboard"


@pytest.mark.parametrize("stem", ["ray-core", "ray-data", "ray-train", "ray-serve", "ray-serve-deployments"])
def test_every_ray_dashboard_filters_by_cluster(everything: Dashboards, stem: str) -> None:
    dashboard = everything[stem]
    assert "Cluster" in [v["name"] for v in dashboard["templating"]["list"]]
    found = dashboards.expressions(dashboard)
    assert len(found) >= 7
    filtered = [expr for _, expr in found if 'ray_io_cluster=~"$Cluster"' in expr]
    # Ray leaves a few cluster-wide expressions unfiltered (e.g. autoscaler totals); nearly all are filtered.
    assert len(filtered) >= 0.9 * len(found), [expr for _, expr in found if expr not in filtered]


def test_train_gets_its_cluster_filter_from_rays_global_filter_option(everything: Dashboards) -> None:
    found = dashboards.expressions(everything["ray-train"])
    assert len(found) >= 10, "Ray's train dashboard lost its panels"
    assert all('ray_io_cluster=~"$Cluster"' in expr for _, expr in found)


def test_overview_covers_clusters_nodes_replacements_jobs_and_gateway(everything: Dashboards) -> None:
    exprs = " ".join(expr for _, expr in dashboards.expressions(everything["raypod-overview"]))
    for metric in (
        "raypod_clusters",
        "raypod_nodes",
        "raypod_node_events_total",
        "raypod_job_attempts_total",
        "raypod_gateway_request_duration_seconds_bucket",
        "raypod_reconcile_duration_seconds_bucket",
    ):
        assert metric in exprs


def test_resolve_substitutes_intervals_and_variables(everything: Dashboards) -> None:
    train = everything["ray-train"]
    expr = 'rate(x{a=~"$Cluster",b=~"${SessionName}"}[$window]) + rate(y[$__rate_interval])'
    assert dashboards.resolve(expr, train, {"Cluster": "demo"}) == 'rate(x{a=~"demo",b=~".*"}[1m]) + rate(y[1m])'


def test_check_reports_each_refused_expression(everything: Dashboards) -> None:
    def picky(expr: str) -> object:
        if "raypod_clusters" in expr:
            raise errors.InvalidSpec("parse error")
        return []

    refused = dashboards.check(picky, {"raypod-overview": everything["raypod-overview"]})
    assert len(refused) >= 1
    assert all(r.dashboard == "raypod-overview" and r.error == "parse error" for r in refused)
    assert all("raypod_clusters" in r.expr for r in refused)


def test_write_produces_dashboards_and_grafana_provisioning(tmp_path: Path) -> None:
    written = dashboards.write(tmp_path, "http://127.0.0.1:9090")
    assert {p.name for p in written} >= {"ray-core.json", "raypod-overview.json", "raypod.yaml"}
    core = json.loads((tmp_path / "dashboards" / "ray-core.json").read_text())
    assert core["title"] == "Ray Core"
    source = yaml.safe_load((tmp_path / "provisioning" / "datasources" / "raypod.yaml").read_text())
    assert source["datasources"][0] | {"url": "http://127.0.0.1:9090", "type": "prometheus"} == source["datasources"][0]
    provider = yaml.safe_load((tmp_path / "provisioning" / "dashboards" / "raypod.yaml").read_text())["providers"][0]
    assert provider["folder"] == "Ray"
    assert Path(provider["options"]["path"]) == (tmp_path / "dashboards").resolve()


def test_the_train_dashboard_shows_hung_runs_filtered_by_cluster(everything: Dashboards) -> None:
    found = dashboards.expressions(everything["ray-train"])
    hangs = [expr for title, expr in found if "raypod_hung_jobs" in expr or "raypod_hang_" in expr]
    assert len(hangs) == 3 and all('ray_io_cluster=~"$Cluster"' in expr for expr in hangs)
    ids = [panel["id"] for panel in everything["ray-train"]["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must stay unique"


def test_the_serve_dashboard_shows_the_kv_cache_and_ttft_filtered_by_cluster(everything: Dashboards) -> None:
    found = dashboards.expressions(everything["ray-serve"])
    ours = [expr for _, expr in found if "ray_raypod_" in expr]
    names = {"serve_ttft_seconds", "kv_cache_hit_chunks", "kv_cache_miss_chunks", "kv_cache_l1_used_bytes"}
    assert all(any(name in expr for expr in ours) for name in names)
    assert all('ray_io_cluster=~"$Cluster"' in expr for expr in ours)
    ids = [panel["id"] for panel in everything["ray-serve"]["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must stay unique"
