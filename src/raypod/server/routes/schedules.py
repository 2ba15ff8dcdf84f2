"""Scheduled jobs' routes (docs/schedules.md): each one call of the schedule service."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Response

from raypod import spec as spec_mod
from raypod import state
from raypod.controlplane.schedules import ScheduleService
from raypod.server.auth import Caller
from raypod.server.routes import part
from raypod.server.routes.clusters import NamePath

router = APIRouter(prefix="/api/v1", tags=["schedules"])
Service = Annotated[ScheduleService, part("schedules")]


@router.post("/schedules", status_code=201)
def create_schedule(caller: Caller, spec: spec_mod.ScheduleSpec, svc: Service) -> state.ScheduleView:
    return svc.create(caller, spec)


@router.get("/schedules")
def list_schedules(caller: Caller, svc: Service, namespace: str | None = None) -> list[state.ScheduleView]:
    return svc.list(caller, namespace)


@router.get("/namespaces/{namespace}/schedules/{name}")
def get_schedule(caller: Caller, namespace: NamePath, name: NamePath, svc: Service) -> state.ScheduleView:
    return svc.get(caller, namespace, name)


@router.post("/namespaces/{namespace}/schedules/{name}/{action}")
def suspend_or_resume_schedule(
    caller: Caller, namespace: NamePath, name: NamePath, action: Literal["suspend", "resume"], svc: Service
) -> state.ScheduleView:
    """``suspend``: no run is made until ``resume`` (the times passed meanwhile are not run)."""
    return svc.set_suspended(caller, namespace, name, action == "suspend")


@router.delete("/namespaces/{namespace}/schedules/{name}", status_code=204)
def delete_schedule(caller: Caller, namespace: NamePath, name: NamePath, svc: Service) -> Response:
    svc.delete(caller, namespace, name)
    return Response(status_code=204)
