"""Governance routes: teams' quotas and the queue of clusters waiting for them."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from fastapi import APIRouter, Path, Response

from raypod import spec as spec_mod
from raypod import state
from raypod.controlplane import governance
from raypod.server.auth import Caller
from raypod.server.routes import part

router = APIRouter(prefix="/api/v1", tags=["governance"])

OwnerPath = Annotated[str, Path(pattern=spec_mod.DNS1123_LABEL.pattern, max_length=63)]  # a team or namespace


Service = Annotated[governance.GovernanceService, part("governance")]


@router.get("/quotas")
def list_quotas(caller: Caller, svc: Service) -> list[state.QuotaView]:
    """Quotas of the caller's teams (every team's for admins), with what each team's clusters hold."""
    return svc.list_quotas(caller)


@router.get("/quotas/kueue")
def kueue_objects(caller: Caller, svc: Service) -> list[dict[str, Any]]:
    """Admins: the quotas as Kueue ResourceFlavor, ClusterQueues, LocalQueues and WorkloadPriorityClasses."""
    return svc.kueue_objects(caller)


class Scope(StrEnum):
    """Whose quota: a team's (set by installation admins), or a namespace's cap inside its team's."""

    TEAMS = "teams"
    NAMESPACES = "namespaces"


@router.get("/{scope}/{owner}/quota")
def get_quota(caller: Caller, svc: Service, scope: Scope, owner: OwnerPath) -> state.QuotaView:
    return (svc.get_quota if scope is Scope.TEAMS else svc.get_namespace_quota)(caller, owner)


@router.put("/{scope}/{owner}/quota")
def set_quota(
    caller: Caller, svc: Service, scope: Scope, owner: OwnerPath, quota: spec_mod.QuotaSpec
) -> state.QuotaView | None:
    """A team's quota: installation admins. A namespace's cap: admins of its team (it borrows nothing). A quota
    below current usage stops nothing: new work waits."""
    return (svc.set_quota if scope is Scope.TEAMS else svc.set_namespace_quota)(caller, owner, quota)


@router.delete("/{scope}/{owner}/quota", status_code=204)
def delete_quota(caller: Caller, svc: Service, scope: Scope, owner: OwnerPath) -> Response:
    (svc.set_quota if scope is Scope.TEAMS else svc.set_namespace_quota)(caller, owner, None)
    return Response(status_code=204)


@router.get("/queue")
def queue(caller: Caller, svc: Service) -> list[state.QueueEntry]:
    """Clusters waiting for admission, in the order they will be admitted, with why each waits."""
    return svc.queue(caller)
