"""Job routes: raypod jobs with retries; each attempt is a Ray submission on the cluster."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile as StarletteUpload
from starlette.formparsers import MultiPartException

from raypod import errors, state
from raypod import spec as spec_mod
from raypod.controlplane import jobs
from raypod.server.auth import Caller
from raypod.server.routes import part
from raypod.server.routes.clusters import NamePath

router = APIRouter(prefix="/api/v1", tags=["jobs"])
JobIdPath = Annotated[str, Path(pattern=spec_mod.JOB_ID_PATTERN)]


Service = Annotated[jobs.JobService, part("jobs")]


UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["files"],
                    "properties": {
                        "files": {
                            "type": "array",
                            "items": {"type": "string", "format": "binary"},
                            "description": "Files named by their path inside the folder.",
                        }
                    },
                }
            }
        },
    }
}


@router.post("/namespaces/{namespace}/clusters/{name}/working-dirs", status_code=201, openapi_extra=UPLOAD_BODY)
async def upload_working_dir(
    caller: Caller, namespace: NamePath, name: NamePath, svc: Service, request: Request
) -> state.WorkingDir:
    """Upload a folder (as a browser sends one) as a Ray working_dir package on the cluster.

    Rights are checked before a byte of the body is read; the body streams to disk (parts over 1 MiB spill to
    temporary files) and is refused with 413 past ``RAYPOD_MAX_UPLOAD_BYTES``.
    """
    limit: int = request.app.state.settings.max_upload_bytes
    await run_in_threadpool(svc.authorize_upload, caller, namespace, name)
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise errors.PayloadTooLarge(f"working dir upload of {int(declared)} bytes is over the limit of {limit} bytes")
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise errors.InvalidSpec("send the folder as multipart/form-data, one 'files' part per file")
    try:
        form = await request.form(max_files=100_000, max_fields=100)
    except MultiPartException as exc:
        raise errors.InvalidSpec(f"malformed multipart body: {exc.message}") from None
    try:
        files = [
            (part.filename or "", part.file) for part in form.getlist("files") if isinstance(part, StarletteUpload)
        ]
        return state.WorkingDir(
            uri=await run_in_threadpool(svc.upload_working_dir, caller, namespace, name, files, limit)
        )
    finally:
        await form.close()


@router.post("/namespaces/{namespace}/clusters/{name}/jobs", status_code=202)
def submit_job(
    caller: Caller, namespace: NamePath, name: NamePath, spec: spec_mod.JobSpec, svc: Service
) -> state.JobView:
    return svc.submit(caller, namespace, name, spec)


@router.get("/namespaces/{namespace}/clusters/{name}/jobs")
def list_jobs(caller: Caller, namespace: NamePath, name: NamePath, svc: Service) -> list[state.JobView]:
    return svc.list(caller, namespace, name)


@router.get("/jobs")
def search_jobs(
    caller: Caller,
    svc: Service,
    namespace: Annotated[str | None, Query(max_length=63)] = None,
    limit: Annotated[int, Query(ge=1, le=5000)] = 500,
) -> list[state.JobView]:
    """The newest jobs of every cluster the caller may view, those of deleted clusters included."""
    return svc.search(caller, namespace, limit)


@router.get("/namespaces/{namespace}/clusters/{name}/history")
def deleted_cluster(caller: Caller, namespace: NamePath, name: NamePath, svc: Service) -> state.DeletedCluster:
    """A deleted cluster as history kept it (its last nodes, its events, its jobs); 404 if none is kept."""
    return svc.deleted_cluster(caller, namespace, name)


@router.get("/jobs/{job_id}/summary")
def job_summary(
    caller: Caller, job_id: JobIdPath, svc: Service, attempt: Annotated[int | None, Query(ge=1, le=100)] = None
) -> dict[str, Any]:
    """An ended attempt's tasks and actors by state and its failed tasks with their errors (from history)."""
    return svc.summary(caller, job_id, attempt)


@router.get("/jobs/{job_id}/metrics")
def job_metrics(
    caller: Caller, job_id: JobIdPath, svc: Service, attempt: Annotated[int | None, Query(ge=1, le=100)] = None
) -> dict[str, Any]:
    """Its cluster's charts over an ended attempt (the console's chart format), kept in history when it ended
    while Prometheus ran."""
    return svc.metrics(caller, job_id, attempt)


@router.get("/jobs/{job_id}")
def get_job(caller: Caller, job_id: JobIdPath, svc: Service) -> state.JobView:
    return svc.get(caller, job_id)


@router.post("/jobs/{job_id}/stop", status_code=202)
def stop_job(caller: Caller, job_id: JobIdPath, svc: Service) -> state.JobView:
    return svc.stop(caller, job_id)


@router.get("/jobs/{job_id}/logs")
def job_logs(
    caller: Caller, job_id: JobIdPath, svc: Service, attempt: Annotated[int | None, Query(ge=1, le=100)] = None
) -> state.JobLogs:
    return state.JobLogs(job=job_id, attempt=attempt, logs=svc.logs(caller, job_id, attempt))
