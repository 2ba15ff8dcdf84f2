"""Serving routes: the model catalog, and models deployed on a cluster's Ray Serve. The OpenAI-compatible API of
each deployment is not here: the gateway forwards it at ``/clusters/<namespace>/<name>/serve/<deployment>/v1``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from raypod import spec as spec_mod
from raypod import state
from raypod.controlplane import serving
from raypod.server.auth import Caller
from raypod.server.routes import part
from raypod.server.routes.clusters import NamePath
from raypod.serving import catalog

router = APIRouter(prefix="/api/v1", tags=["serving"])
ModelIdPath = Annotated[str, Path(pattern=catalog.MODEL_ID.pattern, max_length=129)]


Service = Annotated[serving.ServingService, part("serving")]


@router.get("/models")
def list_models(caller: Caller, svc: Service) -> list[catalog.ModelEntry]:
    return svc.models.list()


@router.post("/models", status_code=202)
def add_model(
    caller: Caller, svc: Service, source: catalog.ModelSource, replace: Annotated[bool, Query()] = False
) -> catalog.ModelAddition:
    """Ask for a source to be added: the serving applier reads it and checksums every file, and
    ``GET /models/{id}/addition`` says how far it is."""
    return svc.models.add(caller, source, replace=replace)


@router.get("/models/{model_id:path}/addition")
def get_model_addition(caller: Caller, svc: Service, model_id: ModelIdPath) -> catalog.ModelAddition:
    """INSPECTING, FAILED (with why) or ADDED (with the entry, whose ``warnings`` say what would refuse a deploy
    later: a directory the cluster's nodes cannot read)."""
    addition = svc.models.addition(model_id)
    if addition.entry is None:
        return addition
    entry = addition.entry.model_copy(update={"warnings": svc.node_visibility_warnings(addition.entry)})
    return addition.model_copy(update={"entry": entry})


@router.get("/models/{model_id:path}")
def get_model(caller: Caller, svc: Service, model_id: ModelIdPath) -> catalog.ModelEntry:
    return svc.models.get(model_id)


@router.delete("/models/{model_id:path}")
def remove_model(caller: Caller, svc: Service, model_id: ModelIdPath) -> catalog.ModelAddition:
    """Remove the entry, or withdraw a request to add it."""
    return svc.models.remove(caller, model_id)


@router.get("/namespaces/{namespace}/clusters/{name}/deployments")
def list_deployments(caller: Caller, svc: Service, namespace: NamePath, name: NamePath) -> list[state.DeploymentView]:
    return svc.list(caller, namespace, name)


@router.post("/namespaces/{namespace}/clusters/{name}/deployments", status_code=202)
def deploy(
    caller: Caller, svc: Service, namespace: NamePath, name: NamePath, spec: spec_mod.ServeDeploySpec
) -> state.DeploymentView:
    """Check that the model fits and its files are intact, then start it on the cluster's Ray Serve."""
    return svc.deploy(caller, namespace, name, spec)


@router.get("/namespaces/{namespace}/clusters/{name}/deployments/{deployment}")
def get_deployment(
    caller: Caller, svc: Service, namespace: NamePath, name: NamePath, deployment: NamePath
) -> state.DeploymentView:
    return svc.get(caller, namespace, name, deployment)


@router.delete("/namespaces/{namespace}/clusters/{name}/deployments/{deployment}", status_code=202)
def delete_deployment(
    caller: Caller, svc: Service, namespace: NamePath, name: NamePath, deployment: NamePath
) -> state.DeploymentView:
    return svc.delete(caller, namespace, name, deployment)
