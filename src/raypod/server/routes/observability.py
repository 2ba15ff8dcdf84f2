"""Monitoring: Prometheus service discovery, raypod's own metrics, and per-cluster charts for the console."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from raypod.controlplane.observability import Monitoring, SdJob
from raypod.server.auth import Caller
from raypod.server.routes import part
from raypod.server.routes.clusters import NamePath

Service = Annotated[Monitoring, part("monitoring")]
router = APIRouter(tags=["monitoring"])


@router.get("/api/v1/monitoring/sd")
def service_discovery(caller: Caller, svc: Service, request: Request, job: SdJob = SdJob.RAY) -> list[dict[str, Any]]:
    """Prometheus HTTP service discovery: the metrics exporter of every alive node of every cluster the caller
    may view (``job=ray``), or raypod's own ``/metrics`` (``job=raypod``)."""
    return svc.targets(caller, job, urlsplit(str(request.base_url)).netloc)


@router.get("/metrics", response_class=Response)
def raypod_metrics(caller: Caller, svc: Service) -> Response:
    """raypod's own metrics in the Prometheus text format (admins: it spans every namespace)."""
    return Response(svc.exposition(caller), media_type=CONTENT_TYPE_LATEST)


@router.get("/api/v1/namespaces/{namespace}/clusters/{name}/charts")
def cluster_charts(
    caller: Caller,
    namespace: NamePath,
    name: NamePath,
    svc: Service,
    minutes: Annotated[int, Query(ge=1, le=24 * 60)] = 30,
) -> dict[str, Any]:
    """CPU, memory, object store and running tasks per node (and Ray Train progress when a run reports), from the
    Prometheus that ``raypod monitoring up`` started: 409 while monitoring is off."""
    return svc.charts(caller, namespace, name, minutes)
