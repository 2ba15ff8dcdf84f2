"""raypod's own metrics (prometheus-client). Counters and histograms live in one module registry and are updated
where things happen; gauges of clusters and nodes are computed at scrape time from the views a caller passes in."""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from raypod import state

REGISTRY = CollectorRegistry(auto_describe=True)

NODE_EVENTS = Counter(
    "raypod_node_events",
    "Node lifecycle events recorded by the reconcile loop.",
    ["ray_io_cluster", "namespace", "kind"],
    registry=REGISTRY,
)
RECONCILE_SECONDS = Histogram(
    "raypod_reconcile_duration_seconds",
    "One reconcile pass over every cluster.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)
JOB_ATTEMPTS = Counter(
    "raypod_job_attempts",
    "Finished raypod job attempts by outcome (SUCCEEDED, FAILED, STOPPED).",
    ["outcome"],
    registry=REGISTRY,
)
GATEWAY_SECONDS = Histogram(
    "raypod_gateway_request_duration_seconds",
    "Requests proxied by the gateway to Ray dashboards, until the response headers.",
    ["route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
    registry=REGISTRY,
)
HANG_DETECTIONS = Counter(
    "raypod_hang_detections",
    "Hung or faulted Ray Train runs detected by the nodes' agents, by kind (hang, rule, fault) and action.",
    ["ray_io_cluster", "namespace", "kind", "action"],
    registry=REGISTRY,
)
HANG_DETECT_SECONDS = Histogram(
    "raypod_hang_detect_seconds",
    "From a hung run's last progress (its last ray.train.report) to its detection.",
    ["ray_io_cluster", "namespace"],
    buckets=(1, 5, 10, 20, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200),
    registry=REGISTRY,
)
HUNG_JOBS = Gauge(
    "raypod_hung_jobs",
    "Ray Train runs that are hung now (no rank has made progress for the run's timeout).",
    ["ray_io_cluster", "namespace"],
    registry=REGISTRY,
)

# Event reasons the loop records (controlplane.execute/status), by the lifecycle kind they count as.
NODE_EVENT_KINDS = {
    "NodeStarted": "started",
    "NodeDied": "died",
    "ReplacedNode": "replaced",
    "CreatedHead": "created",
    "CreatedWorker": "created",
    "DeletedNode": "deleted",
    "GCSUnreachable": "gcs_unreachable",
    "NodeSuspect": "suspect",
    "NodeUnhealthy": "unhealthy",
    "NodeHealthy": "recovered",
    "RemovedUnhealthyNode": "removed_unhealthy",
    "ReplacementLimitReached": "replacement_limit",
    "ScaledUp": "scaled_up",  # the autoscaler's
    "ScaledDown": "scaled_down",
}


def count_node_event(cluster: str, namespace: str, reason: str) -> None:
    kind = NODE_EVENT_KINDS.get(reason)
    if kind:
        NODE_EVENTS.labels(cluster, namespace, kind).inc()


def gateway_route(path: str) -> str:
    """A bounded label for a dashboard path: ``api/jobs`` for ``api/jobs/raysubmit_1/logs``, ``ui`` otherwise."""
    parts = path.strip("/").split("/")
    if parts[0] == "api" and len(parts) > 1 and parts[1].replace("_", "").isalnum():
        return f"api/{parts[1][:32]}"
    return "ui"


class ClusterCollector(Collector):
    """Gauges of clusters and nodes by phase, from the store at scrape time (never stale, nothing to update)."""

    def __init__(self, views: Callable[[], Iterable[state.ClusterView]]) -> None:
        self.views = views

    def collect(self) -> Iterator[Metric]:
        clusters = GaugeMetricFamily("raypod_clusters", "Clusters by phase.", labels=["phase"])
        info = GaugeMetricFamily(
            "raypod_cluster_info", "One series per cluster.", labels=["ray_io_cluster", "namespace", "owner"]
        )
        nodes = GaugeMetricFamily("raypod_nodes", "Nodes by phase.", labels=["ray_io_cluster", "namespace", "phase"])
        desired = GaugeMetricFamily(
            "raypod_nodes_desired", "Nodes the spec asks for.", labels=["ray_io_cluster", "namespace"]
        )
        reachable = GaugeMetricFamily(
            "raypod_cluster_gcs_reachable",
            "1 while the cluster's GCS answers raypod; 0 while its nodes are unknown.",
            labels=["ray_io_cluster", "namespace"],
        )
        health = GaugeMetricFamily(
            "raypod_node_health",
            "1 for each node's current health state (Healthy, Suspect, Unhealthy, Unknown).",
            labels=["ray_io_cluster", "namespace", "node", "state"],
        )
        pending = GaugeMetricFamily(
            "raypod_autoscaler_pending_demand",
            "Requests (tasks, actors, placement-group bundles) the cluster's Ray cannot place yet, by why they wait.",
            labels=["ray_io_cluster", "namespace", "reason"],
        )
        by_phase: Tally[str] = Tally({phase.value: 0 for phase in state.ClusterPhase})
        for view in self.views():
            phase = state.ClusterPhase.DELETING.value if view.deleting else view.status.phase.value
            by_phase[phase] += 1
            name, namespace = view.spec.name, view.spec.namespace
            info.add_metric([name, namespace, view.spec.owner or ""], 1)
            desired.add_metric([name, namespace], view.status.desired_nodes)
            gcs = view.status.condition("GCSReachable")
            reachable.add_metric([name, namespace], 0 if gcs is not None and not gcs.status else 1)
            counts = Tally(node.phase.value for node in view.status.nodes)
            for node_phase in state.NodePhase:
                nodes.add_metric([name, namespace, node_phase.value], counts[node_phase.value])
            waiting: Tally[str] = Tally()
            for demand in view.status.autoscaling.pending if view.status.autoscaling else ():
                waiting[demand.reason.split(":")[0]] += demand.count
            for reason, count in sorted(waiting.items()):
                pending.add_metric([name, namespace, reason], count)
            for node in view.status.nodes:
                for health_state in state.NodeHealthState:
                    health.add_metric([name, namespace, node.name, health_state.value], node.health is health_state)
        for phase, count in sorted(by_phase.items()):
            clusters.add_metric([phase], count)
        yield from (clusters, info, nodes, desired, reachable, health, pending)


def exposition(views: Callable[[], Iterable[state.ClusterView]]) -> bytes:
    """The text a Prometheus scrape of raypod gets."""
    per_scrape = CollectorRegistry(auto_describe=False)
    per_scrape.register(ClusterCollector(views))
    return generate_latest(REGISTRY) + generate_latest(per_scrape)
