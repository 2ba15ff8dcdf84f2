"""Monitoring's verbs: Prometheus' service discovery, raypod's own metrics and a cluster's charts, each for the
callers who may see what it spans."""

from __future__ import annotations

import time
from enum import StrEnum
from pathlib import Path
from typing import Any

from raypod import errors
from raypod.capabilities.observability import charts, discovery, metrics
from raypod.controlplane import identity
from raypod.controlplane.clusters import ClusterService


class SdJob(StrEnum):
    RAY = "ray"
    RAYPOD = "raypod"


class Monitoring:
    def __init__(self, clusters: ClusterService, home: Path) -> None:
        self.clusters = clusters
        self.home = home

    def targets(self, caller: identity.Principal, job: SdJob, server_address: str) -> list[dict[str, Any]]:
        """Prometheus HTTP service discovery: the metrics exporter of every alive node of every cluster the caller
        may view (``ray``), or raypod's own ``/metrics`` at ``server_address`` (``raypod``)."""
        if job is SdJob.RAYPOD:
            return discovery.raypod_targets(server_address)
        return discovery.ray_targets(self.clusters.list(caller))

    def exposition(self, caller: identity.Principal) -> bytes:
        """raypod's own metrics in the Prometheus text format. Raises Forbidden: not an admin."""
        if not caller.is_admin:
            raise errors.Forbidden("raypod's metrics span every namespace: an admin token may read them")
        return metrics.exposition(lambda: self.clusters.list(caller))

    def charts(self, caller: identity.Principal, namespace: str, name: str, minutes: int) -> dict[str, Any]:
        """CPU, memory, object store and running tasks per node (and Ray Train progress when a run reports) over the
        last ``minutes``, from the Prometheus that ``raypod monitoring up`` started.

        Raises:
            NotFound, Forbidden. Conflict: monitoring is not running. TransientError: Prometheus does not answer.
        """
        self.clusters.get(caller, namespace, name)
        end = time.time()
        found = charts.series(self.home, namespace, name, end - minutes * 60, end)
        if found is None:
            raise errors.Conflict("monitoring is off: run 'raypod monitoring up' to start Prometheus")
        return found
