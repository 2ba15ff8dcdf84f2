"""Hang detection's routes: a cluster's hang detections and its live Ray Train runs (docs/hangwatch.md)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from raypod import state
from raypod.controlplane import hangwatch
from raypod.server.auth import Caller
from raypod.server.routes import part
from raypod.server.routes.clusters import NamePath

router = APIRouter(prefix="/api/v1", tags=["hangwatch"])
Collector = Annotated[hangwatch.HangCollector, part("hangs")]
JobQuery = Annotated[str | None, Query(pattern=r"^rj-[0-9a-f]{10}$")]


@router.get("/namespaces/{namespace}/clusters/{name}/hangs")
def list_hangs(
    caller: Caller,
    namespace: NamePath,
    name: NamePath,
    collector: Collector,
    job: JobQuery = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[state.HangDetection]:
    """Hung or faulted Ray Train runs of the cluster (of one job), newest first, with every rank's stack."""
    return collector.detections(caller, namespace, name, job, limit)


@router.get("/namespaces/{namespace}/clusters/{name}/training")
def training_progress(
    caller: Caller, namespace: NamePath, name: NamePath, collector: Collector
) -> list[state.RunProgress]:
    """Live Ray Train runs of the cluster and each rank's progress, as the nodes' agents see it."""
    return collector.training(caller, namespace, name)
