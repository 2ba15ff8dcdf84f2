"""Hang detection's routes: a cluster's hang detections and its live Ray Train runs (docs/hangwatch.md)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Query
from pydantic import BaseModel, Field

from raypod import errors, state
from raypod.controlplane import hangwatch
from raypod.server.auth import Caller, bearer_token
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


class AgentReport(BaseModel):
    """What a node's hangwatch agent wrote since its last report (its files, which stay untrusted)."""

    status: dict[str, Any] | None = None
    detections: dict[str, dict[str, Any]] = Field(default_factory=dict, max_length=hangwatch.MAX_REPORT_DETECTIONS)


def agent_credential(authorization: Annotated[str | None, Header()] = None) -> str:
    """Checked before the body is read: no credential is a 401, whatever was sent."""
    token = bearer_token(authorization)
    if token is None:
        raise errors.Unauthenticated("a hangwatch agent sends 'Authorization: Bearer <its cluster's credential>'")
    return token


@router.post("/hangwatch/agents/{node}")
def agent_report(
    token: Annotated[str, Depends(agent_credential)],
    collector: Collector,
    node: Annotated[str, Path(max_length=253)],
    report: AgentReport,
) -> dict[str, Any]:
    """For the agents in Kubernetes' pods, which share no directory with the server: authenticated with their
    cluster's agent credential (not a user's token; it reports for that cluster only). Answers the control
    plane's requests for the node (a hang to act on)."""
    if collector.reports is None:
        raise errors.NotFound("on this backend the agents' files are read from the nodes' directories")
    return collector.reports.receive(token, node, report.model_dump())
