"""raypod jobs: a Ray job submitted through raypod, retried like KubeRay's RayJob ``backoffLimit``.

Each attempt is one Ray submission (``<job id>-<n>``) on the cluster's dashboard. An attempt that FAILED is
resubmitted after an exponential backoff while retries remain; one that was STOPPED is not. The decision is the
pure function ``decide``; ``JobSupervisor`` applies it.
"""

from __future__ import annotations

import builtins
import hashlib
import io
import json
import logging
import secrets
import threading
import zipfile
from datetime import datetime, timedelta
from enum import StrEnum
from pathlib import PurePosixPath
from typing import Any

import httpx
import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict, Field

from raypod import errors, state
from raypod.capabilities.observability import metrics
from raypod.controlplane import identity, service, store

log = logging.getLogger(__name__)

jobs = sa.Table(
    "jobs",
    store.metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("namespace", sa.String(63), nullable=False),
    sa.Column("cluster", sa.String(63), nullable=False),
    sa.Column("owner", sa.String(63), nullable=False),
    sa.Column("spec", sa.Text, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("attempts", sa.Text, nullable=False),
    sa.Column("stop_requested", sa.Boolean, nullable=False),
    sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)

MAX_BACKOFF_S = 300.0
MAX_WORKING_DIR_BYTES = 100 * 2**20
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})


class JobStatus(StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    RETRYING = "RETRYING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"


class JobSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    entrypoint: str = Field(min_length=1, max_length=16384)
    runtime_env: dict[str, Any] = Field(default_factory=dict)
    metadata: dict[str, str] = Field(default_factory=dict)
    max_retries: int = Field(0, ge=0, le=20, description="Resubmissions after a FAILED attempt (backoffLimit).")
    backoff_s: float = Field(2.0, ge=0, le=MAX_BACKOFF_S, description="First retry delay; doubles each time.")


class Attempt(BaseModel):
    submission_id: str
    status: str = "PENDING"
    message: str = ""
    submitted_at: datetime


class JobView(BaseModel):
    id: str
    namespace: str
    cluster: str
    owner: str
    spec: JobSpec
    status: JobStatus
    attempts: list[Attempt]
    stop_requested: bool = False
    next_attempt_at: datetime | None = None
    created_at: datetime


class Decision(StrEnum):
    WAIT = "wait"
    RETRY = "retry"
    SUCCEED = "succeed"
    FAIL = "fail"
    STOP = "stop"


def decide(job: JobView, ray_status: str, now: datetime) -> tuple[Decision, datetime | None]:
    """What to do with a job whose current attempt Ray reports as ``ray_status``. Pure.

    Returns the decision and, for a retry, when to submit it.
    """
    if ray_status not in TERMINAL:
        return Decision.WAIT, None
    if ray_status == "SUCCEEDED":
        return Decision.SUCCEED, None
    if ray_status == "STOPPED" or job.stop_requested:
        return Decision.STOP, None
    retries_used = len(job.attempts) - 1
    if retries_used >= job.spec.max_retries:
        return Decision.FAIL, None
    delay = min(job.spec.backoff_s * 2**retries_used, MAX_BACKOFF_S)
    return Decision.RETRY, now + timedelta(seconds=delay)


class JobService:
    """Submit, list, stop and read raypod jobs; talks to Ray's job API on the cluster's dashboard."""

    def __init__(self, clusters: service.ClusterService) -> None:
        self.clusters = clusters
        self.engine = clusters.store.engine
        self.http = httpx.Client(timeout=30)

    def submit(self, caller: identity.Principal, namespace: str, cluster: str, spec: JobSpec) -> JobView:
        """Raises Forbidden (not owner/team admin), NotFound, Conflict (no dashboard), TransientError."""
        view = self.clusters.get(caller, namespace, cluster, identity.Verb.OPERATE)
        runtime_env = {**view.spec.runtime_env, **spec.runtime_env}
        spec = spec.model_copy(update={"runtime_env": runtime_env})
        job_id = f"rj-{secrets.token_hex(5)}"
        job = JobView(
            id=job_id,
            namespace=namespace,
            cluster=cluster,
            owner=caller.user,
            spec=spec,
            status=JobStatus.PENDING,
            attempts=[],
            created_at=store.now(),
        )
        self._submit_attempt(view, job)
        with self.engine.begin() as connection:
            connection.execute(jobs.insert().values(**_row(job)))
        return job

    def list(self, caller: identity.Principal, namespace: str, cluster: str) -> builtins.list[JobView]:
        self.clusters.authorize(caller, identity.Verb.VIEW, namespace)
        query = (
            jobs.select().where(jobs.c.namespace == namespace, jobs.c.cluster == cluster).order_by(jobs.c.created_at)
        )
        with self.engine.connect() as connection:
            return [_view(row) for row in connection.execute(query)]

    def get(self, caller: identity.Principal, job_id: str) -> JobView:
        job = self._load(job_id)
        self.clusters.authorize(caller, identity.Verb.VIEW, job.namespace)
        return job

    def stop(self, caller: identity.Principal, job_id: str) -> JobView:
        """Stop the running attempt; a stopped job is never retried."""
        job = self.get(caller, job_id)
        view = self.clusters.get(caller, job.namespace, job.cluster, identity.Verb.OPERATE)
        with self.engine.begin() as connection:
            connection.execute(jobs.update().where(jobs.c.id == job_id).values(stop_requested=True))
        if job.attempts and job.status not in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
            url, headers = self._dashboard(view)
            self._call("POST", f"{url}/api/jobs/{job.attempts[-1].submission_id}/stop", headers)
        return self._load(job_id)

    def logs(self, caller: identity.Principal, job_id: str, attempt: int | None = None) -> str:
        job = self.get(caller, job_id)
        if not job.attempts:
            return ""
        index = len(job.attempts) if attempt is None else attempt
        if not 1 <= index <= len(job.attempts):
            raise errors.NotFound(f"job {job_id} has attempts 1..{len(job.attempts)}, not {index}")
        view = self.clusters.store.get(job.namespace, job.cluster)
        url, headers = self._dashboard(view)
        payload = self._call("GET", f"{url}/api/jobs/{job.attempts[index - 1].submission_id}/logs", headers)
        return str(payload.get("logs", ""))

    def upload_working_dir(
        self, caller: identity.Principal, namespace: str, cluster: str, files: builtins.list[tuple[str, bytes]]
    ) -> str:
        """Zip uploaded files (relative paths, as a browser sends a picked folder) into a Ray package on the
        cluster's GCS, and return its ``gcs://`` URI for ``runtime_env.working_dir``.

        Raises:
            InvalidSpec: no files, an unsafe path, or more than MAX_WORKING_DIR_BYTES. Forbidden, NotFound, Conflict.
        """
        view = self.clusters.get(caller, namespace, cluster, identity.Verb.OPERATE)
        package = build_package(files)
        uri = f"gcs://_ray_pkg_{hashlib.sha1(package).hexdigest()}.zip"
        url, headers = self._dashboard(view)
        self._call("PUT", f"{url}/api/packages/gcs/{uri.removeprefix('gcs://')}", headers, content=package)
        return uri

    # -- supervision ---------------------------------------------------------------------------------------

    def supervise_once(self) -> None:
        """One pass over active jobs: refresh the current attempt, then succeed, fail, stop or retry."""
        with self.engine.connect() as connection:
            rows = connection.execute(
                jobs.select().where(
                    jobs.c.status.not_in([s.value for s in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED)])
                )
            ).all()
        for row in rows:
            job = _view(row)
            try:
                self._supervise(job)
            except errors.RaypodError as exc:
                log.warning("job %s: %s", job.id, exc.message)

    def _supervise(self, job: JobView) -> None:
        now = store.now()
        try:
            view = self.clusters.store.get(job.namespace, job.cluster)
        except errors.NotFound:
            self._save(job.model_copy(update={"status": JobStatus.FAILED}))
            return
        if job.status is JobStatus.RETRYING:
            if job.next_attempt_at and now >= job.next_attempt_at and not job.stop_requested:
                self._submit_attempt(view, job)
                self._save(job)
            elif job.stop_requested:
                self._save(job.model_copy(update={"status": JobStatus.STOPPED}))
            return
        url, headers = self._dashboard(view)
        current = job.attempts[-1]
        info = self._call("GET", f"{url}/api/jobs/{current.submission_id}", headers)
        current.status, current.message = str(info.get("status", "")), str(info.get("message") or "")[:500]
        decision, when = decide(job, current.status, now)
        if decision is not Decision.WAIT:
            metrics.JOB_ATTEMPTS.labels(current.status).inc()
        status = {
            Decision.WAIT: JobStatus.RUNNING if current.status == "RUNNING" else JobStatus.PENDING,
            Decision.SUCCEED: JobStatus.SUCCEEDED,
            Decision.FAIL: JobStatus.FAILED,
            Decision.STOP: JobStatus.STOPPED,
            Decision.RETRY: JobStatus.RETRYING,
        }[decision]
        self._save(job.model_copy(update={"status": status, "next_attempt_at": when}))

    def _submit_attempt(self, view: state.ClusterView, job: JobView) -> None:
        url, headers = self._dashboard(view)
        submission_id = f"{job.id}-{len(job.attempts) + 1}"
        body = {
            "entrypoint": job.spec.entrypoint,
            "submission_id": submission_id,
            "runtime_env": job.spec.runtime_env or None,
            "metadata": {**job.spec.metadata, "raypod_job": job.id, "raypod_owner": job.owner},
        }
        self._call("POST", f"{url}/api/jobs/", headers, json=body)
        job.attempts.append(Attempt(submission_id=submission_id, submitted_at=store.now()))
        job.status, job.next_attempt_at = JobStatus.PENDING, None

    def _dashboard(self, view: state.ClusterView) -> tuple[str, dict[str, str]]:
        url = view.status.endpoints.get("dashboard")
        if not url or view.deleting:
            raise errors.Conflict(f"cluster {view.spec.namespace}/{view.spec.name} has no running dashboard yet")
        return url, self.clusters.backend.dashboard_headers(view.uid)

    def _call(self, method: str, url: str, headers: dict[str, str], **kwargs: Any) -> dict[str, Any]:
        try:
            response = self.http.request(method, url, headers=headers, **kwargs)
        except httpx.HTTPError as exc:
            raise errors.TransientError(f"cluster dashboard is not answering ({type(exc).__name__})") from None
        if response.status_code >= 400:
            raise errors.InvalidSpec(f"Ray refused the request ({response.status_code}): {response.text[:300]}")
        result: dict[str, Any] = response.json() if response.content else {}
        return result

    def _load(self, job_id: str) -> JobView:
        with self.engine.connect() as connection:
            row = connection.execute(jobs.select().where(jobs.c.id == job_id)).first()
        if row is None:
            raise errors.NotFound(f"job '{job_id[:40]}' not found")
        return _view(row)

    def _save(self, job: JobView) -> None:
        row = _row(job)
        with self.engine.begin() as connection:
            connection.execute(
                jobs.update()
                .where(jobs.c.id == job.id)
                .values(status=row["status"], attempts=row["attempts"], next_attempt_at=row["next_attempt_at"])
            )

    def close(self) -> None:
        self.http.close()


class JobSupervisor:
    """A thread that runs ``supervise_once`` every ``interval_s``."""

    def __init__(self, jobs_service: JobService, interval_s: float = 1.0) -> None:
        self.jobs = jobs_service
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="raypod-jobs", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.jobs.supervise_once()
            except Exception:
                log.exception("job supervision pass failed")


def build_package(files: list[tuple[str, bytes]]) -> bytes:
    """A deterministic zip of ``files``; a folder name every path shares is dropped, as Ray's working_dir
    is the folder's contents.

    Raises:
        InvalidSpec: no files, an absolute or escaping path, or too many bytes.
    """
    if not files:
        raise errors.InvalidSpec("working dir: no files were uploaded")
    if sum(len(data) for _, data in files) > MAX_WORKING_DIR_BYTES:
        raise errors.InvalidSpec(f"working dir: more than {MAX_WORKING_DIR_BYTES // 2**20} MiB")
    paths = []
    for name, _ in files:
        path = PurePosixPath(name.replace("\\", "/"))
        if path.is_absolute() or not path.parts or any(part in ("", ".", "..") for part in path.parts):
            raise errors.InvalidSpec(f"working dir: unsafe file path '{name[:200]}'")
        paths.append(path)
    tops = {path.parts[0] for path in paths}
    if len(tops) == 1 and all(len(path.parts) > 1 for path in paths):
        paths = [PurePosixPath(*path.parts[1:]) for path in paths]
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path, (_, data) in sorted(zip(paths, files, strict=True), key=lambda item: str(item[0])):
            archive.writestr(zipfile.ZipInfo(str(path), date_time=(1980, 1, 1, 0, 0, 0)), data, zipfile.ZIP_DEFLATED)
    return buffer.getvalue()


def _row(job: JobView) -> dict[str, Any]:
    return {
        "id": job.id,
        "namespace": job.namespace,
        "cluster": job.cluster,
        "owner": job.owner,
        "spec": job.spec.model_dump_json(),
        "status": job.status.value,
        "attempts": json.dumps([a.model_dump(mode="json") for a in job.attempts]),
        "stop_requested": job.stop_requested,
        "next_attempt_at": job.next_attempt_at,
        "created_at": job.created_at,
    }


def _view(row: sa.Row[tuple[object, ...]]) -> JobView:
    m = row._mapping
    return JobView(
        id=m["id"],
        namespace=m["namespace"],
        cluster=m["cluster"],
        owner=m["owner"],
        spec=JobSpec.model_validate_json(m["spec"]),
        status=JobStatus(m["status"]),
        attempts=[Attempt.model_validate(a) for a in json.loads(m["attempts"])],
        stop_requested=bool(m["stop_requested"]),
        next_attempt_at=store.aware(m["next_attempt_at"]) if m["next_attempt_at"] else None,
        created_at=store.aware(m["created_at"]),
    )
