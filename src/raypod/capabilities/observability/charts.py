"""The console's per-cluster charts: fixed PromQL per chart, scoped to one cluster by its labels, so a caller who
may view a cluster can chart it without being able to query anything else."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raypod import config
from raypod.capabilities.observability.prometheus import PrometheusClient


@dataclass(frozen=True)
class Chart:
    key: str
    title: str
    unit: str  # percent, bytes or count
    expr: str  # ``{selector}`` is replaced by the cluster's label matchers
    legend: str  # the label that names each series
    optional: bool = False  # shown only when it has data (Train runs)


CHARTS = (
    Chart("cpu", "CPU utilisation", "percent", "avg by (node) (ray_node_cpu_utilization{{{selector}}})", "node"),
    Chart("memory", "Memory used", "bytes", "sum by (node) (ray_node_mem_used{{{selector}}})", "node"),
    Chart(
        "object_store", "Object store used", "bytes", "sum by (node) (ray_object_store_memory{{{selector}}})", "node"
    ),
    Chart("tasks", "Running tasks", "count", 'sum by (node) (ray_tasks{{State="RUNNING",{selector}}})', "node"),
    # Ray Train exports no samples/s; the closest built-in signal is how fast runs get through report() calls.
    Chart(
        "train",
        "Ray Train: seconds blocked in report() per second",
        "count",
        "sum by (ray_train_run_name) (rate(ray_train_report_total_blocked_time_s{{{selector}}}[1m]))",
        "ray_train_run_name",
        optional=True,
    ),
)


def selector(namespace: str, cluster: str) -> str:
    """Label matchers of one cluster; names are DNS-1123 labels, so they need no escaping."""
    return f'ray_io_cluster="{cluster}",namespace="{namespace}"'


def charts_between(
    prometheus: PrometheusClient, namespace: str, cluster: str, start: float, end: float
) -> dict[str, Any]:
    """Every chart's series from ``start`` to ``end`` (about 120 points each, at least 5 s apart)."""
    window = max(1.0, end - start)
    step = max(5.0, window / 120)
    charts = []
    for chart in CHARTS:
        expr = chart.expr.format(selector=selector(namespace, cluster))
        result = prometheus.query_range(expr, start, end, step)
        if chart.optional and not result:
            continue
        series = [
            {
                "name": item["metric"].get(chart.legend, "") or "all",
                "points": [[float(t), float(v)] for t, v in item["values"]],
            }
            for item in sorted(result, key=lambda item: item["metric"].get(chart.legend, ""))
        ]
        charts.append({"key": chart.key, "title": chart.title, "unit": chart.unit, "expr": expr, "series": series})
    return {"window_s": window, "step_s": step, "end": end, "charts": charts}


def series(home: Path, namespace: str, cluster: str, start: float, end: float) -> dict[str, Any] | None:
    """A cluster's charts from ``start`` to ``end`` (the console's, or a finished attempt's for history), from the
    Prometheus ``raypod monitoring up`` started; None while monitoring is off.

    Raises:
        TransientError: Prometheus runs but does not answer."""
    endpoints = config.MonitoringEndpoints.read(home)
    if not endpoints.prometheus_url:
        return None
    client = PrometheusClient(endpoints.prometheus_url, auth=endpoints.prometheus_auth)
    try:
        return charts_between(client, namespace, cluster, start, end)
    finally:
        client.close()
