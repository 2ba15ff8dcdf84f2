"""Governance routes: teams' quotas and the queue of clusters waiting for them."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Response

from raypod import spec as spec_mod
from raypod import state
from raypod.controlplane import governance
from raypod.server.auth import Caller
from raypod.server.routes import part

router = APIRouter(prefix="/api/v1", tags=["governance"])

TeamPath = Annotated[str, Path(pattern=spec_mod.DNS1123_LABEL.pattern, max_length=63)]  # a team or namespace


Service = Annotated[governance.GovernanceService, part("governance")]


@router.get("/quotas")
def list_quotas(caller: Caller, svc: Service) -> list[state.QuotaView]:
    """Quotas of the caller's teams (every team's for admins), with what each team's clusters hold."""
    return svc.list_quotas(caller)


@router.get("/quotas/kueue")
def kueue_objects(caller: Caller, svc: Service) -> list[dict[str, Any]]:
    """Admins: the quotas as Kueue ResourceFlavor, ClusterQueues, LocalQueues and WorkloadPriorityClasses."""
    return svc.kueue_objects(caller)


@router.get("/teams/{team}/quota")
def get_quota(caller: Caller, svc: Service, team: TeamPath) -> state.QuotaView:
    return svc.get_quota(caller, team)


@router.put("/teams/{team}/quota")
def set_quota(caller: Caller, svc: Service, team: TeamPath, quota: spec_mod.QuotaSpec) -> state.QuotaView | None:
    """Team admins and global admins. A quota below current usage stops nothing: new work waits."""
    return svc.set_quota(caller, team, quota)


@router.delete("/teams/{team}/quota", status_code=204)
def delete_quota(caller: Caller, svc: Service, team: TeamPath) -> Response:
    svc.set_quota(caller, team, None)
    return Response(status_code=204)


@router.get("/namespaces/{namespace}/quota")
def get_namespace_quota(caller: Caller, svc: Service, namespace: TeamPath) -> state.QuotaView:
    return svc.get_namespace_quota(caller, namespace)


@router.put("/namespaces/{namespace}/quota")
def set_namespace_quota(
    caller: Caller, svc: Service, namespace: TeamPath, quota: spec_mod.QuotaSpec
) -> state.QuotaView | None:
    """Admins of the namespace's team: a cap on the namespace inside the team's quota (it borrows nothing)."""
    return svc.set_namespace_quota(caller, namespace, quota)


@router.delete("/namespaces/{namespace}/quota", status_code=204)
def delete_namespace_quota(caller: Caller, svc: Service, namespace: TeamPath) -> Response:
    svc.set_namespace_quota(caller, namespace, None)
    return Response(status_code=204)


@router.get("/queue")
def queue(caller: Caller, svc: Service) -> list[state.QueueEntry]:
    """Clusters waiting for admission, in the order they will be admitted, with why each waits."""
    return svc.queue(caller)
