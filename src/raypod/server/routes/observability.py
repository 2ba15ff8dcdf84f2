"""Monitoring: Prometheus service discovery, raypod's own metrics, and per-cluster charts for the console."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from raypod import config, errors
from raypod.capabilities.observability import charts, discovery, metrics, prometheus
from raypod.server.auth import Caller
from raypod.server.routes.clusters import NamePath, Service

router = APIRouter(tags=["monitoring"])


class SdJob(StrEnum):
    RAY = "ray"
    RAYPOD = "raypod"


@router.get("/api/v1/monitoring/sd")
def service_discovery(caller: Caller, svc: Service, request: Request, job: SdJob = SdJob.RAY) -> list[dict[str, Any]]:
    """Prometheus HTTP service discovery: the metrics exporter of every alive node of every cluster the caller
    may view (``job=ray``), or raypod's own ``/metrics`` (``job=raypod``)."""
    if job is SdJob.RAYPOD:
        return discovery.raypod_targets(urlsplit(str(request.base_url)).netloc)
    return discovery.ray_targets(svc.list(caller))


@router.get("/metrics", response_class=Response)
def raypod_metrics(caller: Caller, svc: Service) -> Response:
    """raypod's own metrics in the Prometheus text format (admins: it spans every namespace)."""
    if not caller.is_admin:
        raise errors.Forbidden("raypod's metrics span every namespace: an admin token may read them")
    return Response(metrics.exposition(lambda: svc.store.list()), media_type=CONTENT_TYPE_LATEST)


@router.get("/api/v1/namespaces/{namespace}/clusters/{name}/charts")
def cluster_charts(
    caller: Caller,
    namespace: NamePath,
    name: NamePath,
    svc: Service,
    request: Request,
    minutes: Annotated[int, Query(ge=1, le=24 * 60)] = 30,
) -> dict[str, Any]:
    """CPU, memory, object store and running tasks per node (and Ray Train progress when a run reports),
    from the Prometheus that ``raypod monitoring up`` started.

    Raises:
        Conflict: monitoring is not running. TransientError: Prometheus is not answering.
    """
    svc.get(caller, namespace, name)
    endpoints = config.MonitoringEndpoints.read(request.app.state.settings.home)
    if not endpoints.prometheus_url:
        raise errors.Conflict("monitoring is off: run 'raypod monitoring up' to start Prometheus")
    client = prometheus.PrometheusClient(endpoints.prometheus_url, auth=endpoints.prometheus_auth)
    try:
        return charts.cluster_charts(client, namespace, name, minutes)
    finally:
        client.close()
