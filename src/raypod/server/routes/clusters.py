"""Cluster routes. Each parses the request, calls one service method and returns a model."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from raypod import spec as spec_mod
from raypod import state
from raypod.controlplane import store
from raypod.controlplane.clusters import ClusterService
from raypod.controlplane.plane import ControlPlane
from raypod.server import audit
from raypod.server.auth import Caller
from raypod.server.routes import part

router = APIRouter(prefix="/api/v1", tags=["clusters"])

NamePath = Annotated[str, Path(pattern=spec_mod.DNS1123_LABEL.pattern, max_length=63)]
NamespaceQuery = Annotated[str | None, Query(pattern=spec_mod.DNS1123_LABEL.pattern, max_length=63)]


class ScaleRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    group: str = Field(max_length=63)
    replicas: int = Field(ge=0, le=spec_mod.MAX_REPLICAS)


Service = Annotated[ClusterService, part("clusters")]
Plane = Annotated[ControlPlane, part("control_plane")]


# A page's continue token: the last item's "namespace/name" (both DNS labels, so the slash is unambiguous).
ContinueQuery = Annotated[
    str | None, Query(alias="continue", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
]


@router.get("/clusters")
def list_clusters(
    caller: Caller,
    svc: Service,
    response: Response,
    namespace: NamespaceQuery = None,
    limit: Annotated[int | None, Query(ge=1, le=1000)] = None,
    after: ContinueQuery = None,
) -> list[state.ClusterView]:
    """Every cluster the caller may see, or one page of ``limit`` of them: the response's ``X-Continue`` header,
    when present, is the next page's ``continue``, as in Kubernetes' list API."""
    page = svc.list(caller, namespace, after=tuple(after.split("/", 1)) if after else None, limit=limit)  # type: ignore[arg-type]
    if limit is not None and len(page) == limit:
        response.headers["X-Continue"] = f"{page[-1].spec.namespace}/{page[-1].spec.name}"
    return page


@router.post("/clusters", status_code=202)
def create_cluster(caller: Caller, spec: spec_mod.ClusterSpec, svc: Service, request: Request) -> state.ClusterView:
    audit.name_target(request.state, f"{spec.namespace}/{spec.name}")  # the path does not name it
    return svc.create(caller, spec)


@router.get("/namespaces/{namespace}/clusters/{name}")
def get_cluster(caller: Caller, namespace: NamePath, name: NamePath, svc: Service) -> state.ClusterView:
    return svc.get(caller, namespace, name)


@router.post("/namespaces/{namespace}/clusters/{name}/resume", status_code=202)
def resume_cluster(caller: Caller, namespace: NamePath, name: NamePath, svc: Service) -> state.ClusterView:
    """Bring a suspended cluster back (admitted as a new one would be); nothing happens to one that runs."""
    return svc.resume(caller, namespace, name)


@router.post("/namespaces/{namespace}/clusters/{name}/scale", status_code=202)
def scale_cluster(
    caller: Caller, namespace: NamePath, name: NamePath, req: ScaleRequest, svc: Service
) -> state.ClusterView:
    return svc.scale(caller, namespace, name, req.group, req.replicas)


@router.delete("/namespaces/{namespace}/clusters/{name}", status_code=202)
def delete_cluster(caller: Caller, namespace: NamePath, name: NamePath, svc: Service) -> state.ClusterView:
    return svc.delete(caller, namespace, name)


NodeAction = Literal["replace", "cordon", "uncordon"]


@router.post("/namespaces/{namespace}/clusters/{name}/nodes/{node}/{action}", status_code=202)
def node_action(
    caller: Caller, namespace: NamePath, name: NamePath, node: NamePath, action: NodeAction, svc: Service
) -> state.ClusterView:
    """Operators' node verbs: replace (drain, then replace), cordon (no automatic recovery), uncordon."""
    return svc.node_action(caller, namespace, name, node, action)


@router.get("/namespaces/{namespace}/clusters/{name}/events")
def cluster_events(
    caller: Caller,
    namespace: NamePath,
    name: NamePath,
    svc: Service,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> list[state.Event]:
    return svc.events(caller, namespace, name, limit)


@router.get("/namespaces/{namespace}/clusters/{name}/manifest")
def cluster_manifest(caller: Caller, namespace: NamePath, name: NamePath, svc: Service, plane: Plane) -> dict[str, Any]:
    """The KubeRay RayCluster that would run this cluster on Kubernetes, with its pods' add-ons (the hangwatch
    agent, a workspace's IDE)."""
    return plane.manifest(svc.get(caller, namespace, name))


@router.get("/events")
def search_events(
    caller: Caller,
    svc: Service,
    namespace: NamespaceQuery = None,
    cluster: Annotated[str | None, Query(pattern=spec_mod.DNS1123_LABEL.pattern, max_length=63)] = None,
    kind: Annotated[state.EventType | None, Query(alias="type")] = None,
    text: Annotated[str | None, Query(max_length=200, description="Matches reason, message or node.")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> list[state.Event]:
    """Events across every cluster the caller may view (health and hang events land here too)."""
    where = store.EventFilter(
        namespaces=frozenset({namespace}) if namespace else None, cluster=cluster, type=kind, text=text or None
    )
    return svc.search_events(caller, where, limit)
