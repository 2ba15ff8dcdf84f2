"""Job routes: raypod jobs with retries; each attempt is a Ray submission on the cluster."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, File, Path, Query, Request, UploadFile
from starlette.concurrency import run_in_threadpool

from raypod import spec as spec_mod
from raypod import state
from raypod.controlplane import jobs
from raypod.server.auth import Caller
from raypod.server.routes.clusters import NamePath

router = APIRouter(prefix="/api/v1", tags=["jobs"])
JobIdPath = Annotated[str, Path(pattern=r"^rj-[0-9a-f]{10}$")]


def job_service(request: Request) -> jobs.JobService:
    svc: jobs.JobService = request.app.state.jobs
    return svc


Service = Annotated[jobs.JobService, Depends(job_service)]


@router.post("/namespaces/{namespace}/clusters/{name}/working-dirs", status_code=201)
async def upload_working_dir(
    caller: Caller,
    namespace: NamePath,
    name: NamePath,
    svc: Service,
    files: Annotated[list[UploadFile], File(description="Files named by their path inside the folder.")],
) -> state.WorkingDir:
    """Upload a folder (as a browser sends one) as a Ray working_dir package on the cluster."""
    contents = [(upload.filename or "", await upload.read()) for upload in files]
    return state.WorkingDir(uri=await run_in_threadpool(svc.upload_working_dir, caller, namespace, name, contents))


@router.post("/namespaces/{namespace}/clusters/{name}/jobs", status_code=201)
def submit_job(
    caller: Caller, namespace: NamePath, name: NamePath, spec: spec_mod.JobSpec, svc: Service
) -> state.JobView:
    return svc.submit(caller, namespace, name, spec)


@router.get("/namespaces/{namespace}/clusters/{name}/jobs")
def list_jobs(caller: Caller, namespace: NamePath, name: NamePath, svc: Service) -> list[state.JobView]:
    return svc.list(caller, namespace, name)


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
