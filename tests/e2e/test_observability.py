"""Observability with a real Prometheus (Debian's package) scraping real clusters through raypod's discovery:
`raypod monitoring up`, cluster-labelled series, every dashboard expression accepted by Prometheus, core panels
with data, the console's chart endpoint, the Ray dashboard's metrics views, a deleted cluster dropping out,
and `raypod monitoring down`."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from raypod import errors, state
from raypod.capabilities.observability import dashboards, prometheus
from raypod.client._http import tls_verify
from raypod.testing import free_port
from tests.conftest import SHARED_CLUSTER
from tests.e2e.conftest import BROWSER_ARTIFACTS, BROWSER_MISSING, CHROMIUM, RaypodServer, log_in
from tests.e2e.test_gateway import run_cli

PROMETHEUS = os.environ.get("RAYPOD_PROMETHEUS_BIN") or shutil.which("prometheus") or "/usr/bin/prometheus"
MISSING = not Path(PROMETHEUS).exists() and not os.environ.get("RAYPOD_REQUIRE_PROMETHEUS")
HEAD = {"head": {"memory": "512Mi", "object_store_memory": "100Mi"}}

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(900),
    pytest.mark.skipif(MISSING, reason="Prometheus is not installed (apt-get install prometheus)"),
]


def eventually(check: Callable[[], Any], timeout: float = 90.0, every: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check()
            if result:
                return result
        except (AssertionError, httpx.HTTPError):
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout} s: {check.__doc__ or check}")
        time.sleep(every)


def monitoring_up(server: RaypodServer, port: int) -> tuple[str, str]:
    started = run_cli(server, "raypod", "monitoring", "up", "--port", str(port), "--scrape-interval", "2s")
    assert started.returncode == 0, started.stderr + started.stdout
    return ("raypod", (server.home / "monitoring" / "prometheus-password").read_text().strip())


@pytest.fixture(scope="module")
def prom(raypod_server: RaypodServer) -> Iterator[prometheus.PrometheusClient]:
    port = free_port()
    client = prometheus.PrometheusClient(f"http://127.0.0.1:{port}", auth=monitoring_up(raypod_server, port))
    try:
        yield client
    finally:
        client.close()
        run_cli(raypod_server, "raypod", "monitoring", "down")


@pytest.fixture
def clusters(raypod_server: RaypodServer, shared_cluster: state.ClusterView) -> list[str]:
    """Two clusters to scrape: the session's shared one and one of this module's (``mon-b``, which the deletion
    test removes; the next test that needs it makes it again, so the tests pass in any order)."""
    with raypod_server.client() as api:
        if "mon-b" not in {view.spec.name for view in api.clusters.list()}:
            api.clusters.create({"name": "mon-b", **HEAD})
        api.clusters.wait_ready("mon-b", timeout=180)
    return [SHARED_CLUSTER, "mon-b"]


def clusters_with(prom: prometheus.PrometheusClient, expr: str) -> set[str]:
    return {series["metric"].get("ray_io_cluster", "") for series in prom.query(expr)}


def test_prometheus_scrapes_every_cluster_with_its_name(
    raypod_server: RaypodServer, prom: prometheus.PrometheusClient, clusters: list[str]
) -> None:
    def both_scraped() -> bool:
        return set(clusters) <= clusters_with(prom, "ray_node_cpu_utilization")

    eventually(both_scraped)
    for series in prom.query(f'ray_node_cpu_utilization{{ray_io_cluster="{SHARED_CLUSTER}"}}'):
        labels = series["metric"]
        assert (labels["namespace"], labels["role"], labels["node"], labels["node_group"]) == (
            "default",
            "head",
            "head",
            "headgroup",
        )
        assert labels["node_id"]
    # raypod's own metrics, scraped with its token over TLS.
    eventually(lambda: {SHARED_CLUSTER, "mon-b"} <= clusters_with(prom, "raypod_cluster_info"))
    assert float(prom.query('raypod_clusters{phase="Ready"}')[0]["value"][1]) >= 2

    status = run_cli(raypod_server, "raypod", "monitoring", "status")
    assert status.returncode == 0, status.stderr
    assert f"default/{SHARED_CLUSTER} head" in status.stdout and "raypod: up" in status.stdout

    # Without a token, discovery refuses.
    with httpx.Client(verify=False) as anonymous:
        assert anonymous.get(f"{raypod_server.url}/api/v1/monitoring/sd").status_code == 401


def test_every_dashboard_expression_is_accepted_and_core_panels_have_data(
    raypod_server: RaypodServer, prom: prometheus.PrometheusClient, clusters: list[str], tmp_path: Path
) -> None:
    checked = run_cli(raypod_server, "raypod", "monitoring", "dashboards", "--out", str(tmp_path), "--check")
    assert checked.returncode == 0, checked.stdout[-3000:]
    accepted = checked.stdout.strip().splitlines()[-1]
    total = sum(len(dashboards.expressions(d)) for d in dashboards.all_dashboards().values())
    assert accepted.startswith(f"{total} of {total} expressions accepted"), accepted
    assert json.loads((tmp_path / "dashboards" / "ray-core.json").read_text())["title"] == "Ray Core"

    eventually(lambda: SHARED_CLUSTER in clusters_with(prom, "ray_node_mem_used"))
    core = dashboards.ray_dashboards()["ray-core"]
    wanted = {"Node CPU Usage %", "Node Memory Usage (heap + object store)", "Object Store Memory Usage"}
    panels = [(title, expr) for title, expr in dashboards.expressions(core) if title in wanted]
    assert {title for title, _ in panels} == wanted

    def every_core_panel_has_series() -> bool:
        for title, expr in panels:
            assert prom.query(dashboards.resolve(expr, core, {"Cluster": SHARED_CLUSTER})), title
        return True

    eventually(every_core_panel_has_series, timeout=60)
    other = dashboards.resolve(panels[0][1], core, {"Cluster": "no-such-cluster"})
    assert prom.query(other) == []


def test_console_charts_and_the_ray_dashboard_use_prometheus(
    raypod_server: RaypodServer, prom: prometheus.PrometheusClient, clusters: list[str]
) -> None:
    def cpu_chart_has_points() -> dict[str, Any]:
        with raypod_server.client() as api:
            charts = api.request("GET", f"/api/v1/namespaces/default/clusters/{SHARED_CLUSTER}/charts?minutes=5")
        by_key = {chart["key"]: chart for chart in charts["charts"]}
        assert {"cpu", "memory", "object_store", "tasks"} <= set(by_key)
        series = by_key["cpu"]["series"]
        assert [s["name"] for s in series] == ["head"] and len(series[0]["points"]) >= 2
        return by_key

    by_key = eventually(cpu_chart_has_points)
    assert by_key["memory"]["series"][0]["points"][-1][1] > 100 * 2**20

    # Prometheus holds every tenant's metrics and answers only raypod's credentials (issue 28): the head's Ray
    # dashboard (reached through the gateway) and anything else on the host are refused.
    with httpx.Client(verify=tls_verify(raypod_server.ca_file)) as http:
        health = http.get(
            f"{raypod_server.url}/clusters/default/{SHARED_CLUSTER}/api/prometheus_health",
            headers={"Authorization": f"Bearer {raypod_server.admin_token}"},
        )
    assert health.status_code >= 400 or health.json().get("result") is False, health.text  # Ray answers 500
    anonymous = httpx.get(f"{prom.url}/api/v1/query", params={"query": "up"}, timeout=5)
    assert anonymous.status_code == 401


@pytest.mark.browser
@pytest.mark.skipif(BROWSER_MISSING, reason=f"{CHROMIUM} is not installed (apt-get install chromium)")
def test_the_console_draws_the_cluster_charts(
    raypod_server: RaypodServer, prom: prometheus.PrometheusClient, clusters: list[str], page: Any
) -> None:
    eventually(lambda: SHARED_CLUSTER in clusters_with(prom, "ray_node_mem_used"))
    log_in(page, raypod_server, f"/namespaces/default/clusters/{SHARED_CLUSTER}")
    cpu = page.locator("figure.chart[data-chart=cpu]")
    cpu.locator("polyline[data-series=head]").wait_for(timeout=60_000)
    assert "head" in (cpu.locator("svg").first.get_attribute("aria-label") or "")
    assert page.locator("figure.chart").count() >= 4
    folder = BROWSER_ARTIFACTS / "monitoring"
    folder.mkdir(parents=True, exist_ok=True)
    page.locator("#charts").screenshot(path=folder / "cluster-charts.png")


def test_a_deleted_cluster_drops_out_of_discovery_and_scraping(
    raypod_server: RaypodServer, prom: prometheus.PrometheusClient, clusters: list[str]
) -> None:
    eventually(lambda: "mon-b" in clusters_with(prom, "up"))
    with raypod_server.client() as api:
        job = api.jobs.submit("mon-b", {"entrypoint": "python -c 'import time; time.sleep(1)'"})
        assert api.jobs.wait(job.id, timeout=120).status is state.JobStatus.SUCCEEDED
        api.clusters.delete("mon-b")
        api.clusters.wait_deleted("mon-b", timeout=120)
        sd = api.request("GET", "/api/v1/monitoring/sd")
        # history kept the cluster's series over the job's attempt (issue 33), readable after the deletion
        kept = {chart["key"]: chart for chart in api.jobs.metrics(job.id)["charts"]}
    assert "mon-b" not in {group["labels"]["ray_io_cluster"] for group in sd}
    assert [series["name"] for series in kept["memory"]["series"]] == ["head"], kept["memory"]
    assert kept["memory"]["series"][0]["points"][-1][1] > 100 * 2**20

    def gone_from_targets() -> bool:
        response = prom.http.get(f"{prom.url}/api/v1/targets", params={"state": "active"})
        names = {t["labels"].get("ray_io_cluster") for t in response.json()["data"]["activeTargets"]}
        return "mon-b" not in names and SHARED_CLUSTER in names

    eventually(gone_from_targets, timeout=60)


def test_monitoring_down_stops_prometheus_and_revokes_its_token(
    raypod_server: RaypodServer, prom: prometheus.PrometheusClient, shared_cluster: state.ClusterView
) -> None:
    token = (raypod_server.home / "monitoring" / "token").read_text()
    assert oct((raypod_server.home / "monitoring" / "token").stat().st_mode & 0o777) == "0o600"
    stopped = run_cli(raypod_server, "raypod", "monitoring", "down")
    try:
        assert stopped.returncode == 0 and "token is revoked" in stopped.stdout
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{prom.url}/-/ready", timeout=2)
        with httpx.Client(verify=False) as http:
            sd = f"{raypod_server.url}/api/v1/monitoring/sd"
            refused = http.get(sd, headers={"Authorization": f"Bearer {token}"})
        assert refused.status_code == 401
        with raypod_server.client() as api, pytest.raises(errors.Conflict, match="monitoring is off"):
            api.request("GET", f"/api/v1/namespaces/default/clusters/{shared_cluster.spec.name}/charts")
    finally:
        # Up again on the same port, as the module's other tests found it (they may run after this one).
        prom.http.auth = monitoring_up(raypod_server, int(prom.url.rsplit(":", 1)[1]))
