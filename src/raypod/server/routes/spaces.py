"""Workspace routes. The IDE itself is not here: the gateway forwards ``/spaces/<namespace>/<name>/``."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from raypod import spec as spec_mod
from raypod import state
from raypod.controlplane import spaces
from raypod.server.auth import Caller
from raypod.server.routes import part
from raypod.server.routes.clusters import NamePath

router = APIRouter(prefix="/api/v1", tags=["spaces"])


Service = Annotated[spaces.SpaceService, part("spaces")]


class SpaceCreate(spec_mod.SpaceSpec):
    cluster: str = Field(min_length=1, max_length=63, description="The cluster the workspace joins.")


class SpaceMove(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cluster: str = Field(min_length=1, max_length=63)


@router.get("/spaces")
def list_all(caller: Caller, svc: Service) -> list[state.SpaceView]:
    return svc.list(caller)


@router.get("/namespaces/{namespace}/spaces")
def list_spaces(caller: Caller, svc: Service, namespace: NamePath) -> list[state.SpaceView]:
    return svc.list(caller, namespace)


@router.post("/namespaces/{namespace}/spaces", status_code=201)
def create(caller: Caller, svc: Service, namespace: NamePath, body: SpaceCreate) -> state.SpaceView:
    """A zero-compute node of the cluster with an IDE on it; Ready once the IDE answers."""
    space = spec_mod.SpaceSpec.model_validate(body.model_dump(exclude={"cluster"}))
    return svc.create(caller, namespace, body.cluster, space)


@router.get("/namespaces/{namespace}/spaces/{name}")
def get(caller: Caller, svc: Service, namespace: NamePath, name: NamePath) -> state.SpaceView:
    return svc.get(caller, namespace, name)


@router.post("/namespaces/{namespace}/spaces/{name}/move")
def move(caller: Caller, svc: Service, namespace: NamePath, name: NamePath, body: SpaceMove) -> state.SpaceView:
    return svc.move(caller, namespace, name, body.cluster)


@router.post("/namespaces/{namespace}/spaces/{name}/{action}")
def start_or_stop(
    caller: Caller, svc: Service, namespace: NamePath, name: NamePath, action: Literal["start", "stop"]
) -> state.SpaceView:
    """``stop``: its node stops, its files stay; ``start`` brings it back."""
    return svc.set_running(caller, namespace, name, action == "start")


@router.delete("/namespaces/{namespace}/spaces/{name}")
def delete(
    caller: Caller,
    svc: Service,
    namespace: NamePath,
    name: NamePath,
    keep_files: Annotated[bool, Query(description="False also deletes the workspace's files.")] = True,
) -> state.SpaceView:
    return svc.delete(caller, namespace, name, keep_files)
