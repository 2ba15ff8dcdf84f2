"""Prometheus HTTP service discovery: one target group per alive Ray node. Pure."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from raypod import state

SCRAPED_PHASES = frozenset({state.NodePhase.RUNNING, state.NodePhase.DRAINING})


def ray_targets(views: Iterable[state.ClusterView]) -> list[dict[str, Any]]:
    """Target groups (Prometheus ``http_sd`` format) for the metrics exporter of every alive node.

    Labels: ``ray_io_cluster`` (the cluster name, what Ray's dashboards filter on), ``namespace``,
    ``node_group``, ``node`` (raypod's node name), ``node_id`` (Ray's) and ``role`` (head or worker).
    Deleted and deleting clusters, and dead nodes, are left out, so their series end.
    """
    groups = []
    for view in sorted(views, key=lambda v: (v.spec.namespace, v.spec.name)):
        if view.deleting:
            continue
        for node in view.status.nodes:
            if node.phase not in SCRAPED_PHASES or not node.metrics_endpoint:
                continue
            groups.append(
                {
                    "targets": [node.metrics_endpoint],
                    "labels": {
                        "ray_io_cluster": view.spec.name,
                        "namespace": view.spec.namespace,
                        "node_group": node.group,
                        "node": node.name,
                        "node_id": node.ray_node_id or "",
                        "role": "head" if node.is_head else "worker",
                    },
                }
            )
    return groups


def raypod_targets(address: str) -> list[dict[str, Any]]:
    """The raypod server's own ``/metrics`` (``address`` is host:port)."""
    return [{"targets": [address], "labels": {"service": "raypod"}}]
