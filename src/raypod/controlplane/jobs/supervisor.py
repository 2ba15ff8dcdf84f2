"""Supervision of jobs: follow each attempt on Ray, retry failed ones, and import jobs that plain Ray tooling
(``ray job submit``, ``JobSubmissionClient``) submitted, so every job of a cluster is listed in one place."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import pydantic

from raypod import errors, state
from raypod import spec as spec_mod
from raypod.capabilities.observability import metrics
from raypod.controlplane import store
from raypod.controlplane.jobs import retry
from raypod.controlplane.jobs.service import JobService
from raypod.controlplane.periodic import Periodic

log = logging.getLogger(__name__)

IMPORT_INTERVAL_S = 3.0
SUBMIT_PATIENCE_S = 120.0  # how long a first submission Ray cannot take yet is tried again
IMPORT_BATCH = 100
IMPORTED_PHASES = frozenset({state.ClusterPhase.READY, state.ClusterPhase.DEGRADED})
LOST_ATTEMPT = "Ray has no record of this attempt: the cluster's head was replaced and its job table with it"


class JobSupervisor(Periodic):
    """A thread that runs ``supervise_once`` every ``interval_s``."""

    thread_name = "raypod-jobs"

    def __init__(self, jobs: JobService, interval_s: float = 1.0, import_interval_s: float = IMPORT_INTERVAL_S) -> None:
        super().__init__(interval_s)
        self.jobs = jobs
        self.import_interval_s = import_interval_s
        self._last_import = 0.0
        self._import_after: tuple[str, str] | None = None

    def run_once(self) -> None:
        self.supervise_once()

    def supervise_once(self) -> None:
        """Import new plain-Ray jobs (every ``import_interval_s``), then refresh every active job."""
        if time.monotonic() - self._last_import >= self.import_interval_s:
            self._last_import = time.monotonic()
            # A batch of clusters per pass, in turns: each one asks a cluster's job API, so a fleet of thousands
            # is covered every few passes rather than hammered every few seconds.
            page = self.jobs.clusters.store.list(after=self._import_after, limit=IMPORT_BATCH)
            self._import_after = (page[-1].spec.namespace, page[-1].spec.name) if len(page) == IMPORT_BATCH else None
            self.import_ray_jobs(page)
        for job in self.jobs.records.active():
            try:
                self._supervise(job)
            except errors.RaypodError as exc:
                log.warning("job %s: %s", job.id, exc.message)

    def import_ray_jobs(self, views: Iterable[state.ClusterView] | None = None) -> int:
        """Record the Ray submissions of each running cluster (of ``views``, or all) that raypod did not make;
        returns how many."""
        imported = 0
        for view in self.jobs.clusters.store.list() if views is None else views:
            if view.deleting or view.status.phase not in IMPORTED_PHASES:
                continue
            try:
                found = self.jobs.api(view).list()
            except errors.RaypodError as exc:
                log.debug("cluster %s/%s: jobs not listed: %s", view.spec.namespace, view.spec.name, exc.message)
                continue
            candidates = {imported_id(view.uid, j["submission_id"]): j for j in found if _is_foreign(j)}
            known = self.jobs.records.known_ids(list(candidates)) if candidates else set()
            for job_id, info in candidates.items():
                owner = self.jobs.attribution.submitter(view.spec.namespace, view.spec.name, info)
                if job_id not in known and self.jobs.records.insert(_imported(view, job_id, info, owner)):
                    imported += 1
        return imported

    def _supervise(self, job: state.JobView) -> None:
        """The one writer of a job's status and attempts: what requests stored (a new job, a stop, a requested
        failure) is carried out here, and each attempt is followed on Ray."""
        now = store.now()
        try:
            view = self.jobs.clusters.store.get(job.namespace, job.cluster)
        except errors.NotFound:
            self.jobs.records.save(job.model_copy(update={"status": state.JobStatus.FAILED}))
            return
        if job.fail_requested is not None:
            self._fail(view, job, job.fail_requested)
            return
        if not job.attempts:
            self._first_attempt(view, job)
            return
        if job.status is state.JobStatus.RETRYING:
            if job.stop_requested:
                self.jobs.records.save(job.model_copy(update={"status": state.JobStatus.STOPPED}))
            elif job.next_attempt_at and now >= job.next_attempt_at and _runs(view):
                self.jobs.submit_attempt(view, job)
                self.jobs.records.save(job)
            return
        current = job.attempts[-1]
        if job.spec.as_rayjob:
            self._follow_rayjob(job, current)
            return
        if job.stop_requested and not view.queued and current.status not in state.FINISHED_JOB_STATUSES:
            self.jobs.api(view).stop(current.submission_id)
        try:
            info = self.jobs.api(view).info(current.submission_id)
        except errors.NotFound:
            # Ray answers but has no record of it: the head was replaced without GCS fault tolerance and its job
            # table went with it. The attempt is lost, which counts as failed (and is retried per its policy).
            info = {"status": "FAILED", "message": LOST_ATTEMPT}
        except errors.RaypodError:
            if not view.queued:
                raise
            info = {"status": "FAILED"}  # the preempted cluster's head is gone: so is the attempt
        if view.queued and info.get("status") in ("FAILED", "STOPPED") and not job.stop_requested:
            self._preempted(view, job, current)
            return
        current.status, current.message = str(info.get("status", "")), str(info.get("message") or "")[:500]
        if current.status in ("SUCCEEDED", "FAILED", "STOPPED"):
            try:  # its log outlives the cluster; the attempt's end is recorded whether or not this works
                self.jobs.archive_attempt(view, job, len(job.attempts))
            except errors.RaypodError as exc:
                log.warning("job %s: attempt %d's log not archived: %s", job.id, len(job.attempts), exc.message)
        decision, when = retry.decide(job, current.status, now)
        if decision is retry.Decision.WAIT:
            status = state.JobStatus.RUNNING if current.status == "RUNNING" else state.JobStatus.PENDING
        else:
            metrics.JOB_ATTEMPTS.labels(current.status).inc()
            status = retry.STATUS_OF[decision]
        self.jobs.records.save(job.model_copy(update={"status": status, "next_attempt_at": when}))

    def _first_attempt(self, view: state.ClusterView, job: state.JobView) -> None:
        """Submit a stored job to Ray (a RayJob to KubeRay). What Ray refuses fails the job with Ray's reason;
        a cluster not ready yet (no dashboard, queued, a transient error) is tried again on a later pass."""
        if job.stop_requested:
            self.jobs.records.save(job.model_copy(update={"status": state.JobStatus.STOPPED}))
            return
        try:
            if job.spec.as_rayjob:
                self.jobs.submit_rayjob(view, job)
            else:
                if not _runs(view):
                    return
                self.jobs.submit_attempt(view, job)
        except (errors.InvalidSpec, errors.TransientError) as exc:
            # Ray answers "try again later" for a while after a head starts (no job agent yet): tried again on the
            # next passes, for SUBMIT_PATIENCE_S at most.
            waited = (store.now() - job.created_at).total_seconds()
            if isinstance(exc, errors.TransientError) and waited < SUBMIT_PATIENCE_S:
                raise
            refused = state.Attempt(
                submission_id=f"{job.id}-1", status="FAILED", message=exc.message[:500], submitted_at=store.now()
            )
            metrics.JOB_ATTEMPTS.labels("FAILED").inc()
            self.jobs.records.save(job.model_copy(update={"status": state.JobStatus.FAILED, "attempts": [refused]}))
            return
        self.jobs.records.save(job)

    def _fail(self, view: state.ClusterView, job: state.JobView, reason: str) -> None:
        """Carry out a requested failure: the attempt is stopped on Ray (it may have ended on its own), and the
        reason becomes its message either way."""
        if job.attempts:
            current = job.attempts[-1]
            if not job.spec.as_rayjob:
                with contextlib.suppress(errors.RaypodError):
                    self.jobs.api(view).stop(current.submission_id)
            current.status, current.message = "FAILED", reason[:500]
        self.jobs.records.save(job.model_copy(update={"status": state.JobStatus.FAILED, "next_attempt_at": None}))

    def _preempted(self, view: state.ClusterView, job: state.JobView, current: state.Attempt) -> None:
        """The attempt ended because governance preempted its cluster: a raypod job is submitted again once the
        cluster is admitted (its run resumes from its last checkpoint), without using up a retry; a job that
        plain Ray tooling submitted cannot be resubmitted by raypod and fails."""
        current.status = retry.PREEMPTED
        resubmitted = job.submitted_via is state.SubmittedVia.RAYPOD
        then = "it is submitted again when the cluster is admitted" if resubmitted else "it was not submitted by raypod"
        current.message = f"its cluster was queued again ({view.queue_reason}); {then}"[:500]
        status = state.JobStatus.RETRYING if resubmitted else state.JobStatus.FAILED
        self.jobs.records.save(
            job.model_copy(update={"status": status, "next_attempt_at": store.now() if resubmitted else None})
        )
        self.jobs.clusters.store.record(
            view, state.EventType.WARNING, "JobPreempted", f"job {job.id} attempt {len(job.attempts)}: {then}"
        )

    def _follow_rayjob(self, job: state.JobView, current: state.Attempt) -> None:
        """A RayJob's status as KubeRay reports it: KubeRay retries it (backoffLimit), raypod only follows. A stop
        deletes it, its cluster with it."""
        if job.stop_requested:
            self.jobs.rayjobs().delete_rayjob(job.namespace, job.id)
            self.jobs.records.save(job.model_copy(update={"status": state.JobStatus.STOPPED}))
            return
        found = self.jobs.rayjobs().rayjob_status(job.namespace, job.id)
        if found is None:
            return  # not seen yet (the watch is behind, or the API server is away): nothing concluded
        current.status, current.message = found[0], found[1][:500]
        status = RAYJOB_STATUSES.get(current.status, state.JobStatus.PENDING)
        self.jobs.records.save(job.model_copy(update={"status": status}))


def _runs(view: state.ClusterView) -> bool:
    """Whether the cluster can take a submission: admitted, and its dashboard up."""
    return not view.queued and not view.suspended and not view.deleting and bool(view.status.endpoints.get("dashboard"))


RAYJOB_STATUSES = {
    "PENDING": state.JobStatus.PENDING,
    "RUNNING": state.JobStatus.RUNNING,
    "SUCCEEDED": state.JobStatus.SUCCEEDED,
    "FAILED": state.JobStatus.FAILED,
    "STOPPED": state.JobStatus.STOPPED,
}
INTERNAL_JOB = "raypod_internal"  # metadata of jobs raypod runs for itself (Serve deploys): never imported


def imported_id(cluster_uid: str, submission_id: str) -> str:
    """A stable raypod id for a plain-Ray submission: importing it twice finds the same row."""
    return f"rj-{hashlib.sha1(f'{cluster_uid}/{submission_id}'.encode()).hexdigest()[:10]}"


def _is_foreign(info: dict[str, Any]) -> bool:
    metadata = info.get("metadata") or {}
    return bool(info.get("submission_id")) and "raypod_job" not in metadata and INTERNAL_JOB not in metadata


def _imported(view: state.ClusterView, job_id: str, info: dict[str, Any], owner: str) -> state.JobView:
    started = info.get("start_time")
    submitted_at = datetime.fromtimestamp(started / 1000, UTC) if isinstance(started, int | float) else store.now()
    metadata = {str(k)[:128]: str(v)[:1024] for k, v in list((info.get("metadata") or {}).items())[:64]}
    runtime_env = info.get("runtime_env") if isinstance(info.get("runtime_env"), dict) else {}
    entrypoint = str(info.get("entrypoint") or "(unknown)")[:16384]
    try:
        spec = spec_mod.JobSpec(entrypoint=entrypoint, runtime_env=runtime_env or {}, metadata=metadata)
    except pydantic.ValidationError:  # what Ray accepted may be beyond raypod's limits: keep what identifies it
        spec = spec_mod.JobSpec(entrypoint=entrypoint)
    ray_status = str(info.get("status", "PENDING"))
    attempt = state.Attempt(
        submission_id=str(info["submission_id"]),
        status=ray_status,
        message=str(info.get("message") or "")[:500],
        submitted_at=submitted_at,
    )
    return state.JobView(
        id=job_id,
        namespace=view.spec.namespace,
        cluster=view.spec.name,
        owner=owner,  # who submitted it through the gateway, where its signature proves it; else ""
        spec=spec,
        status=state.JobStatus.RUNNING if ray_status == "RUNNING" else state.JobStatus.PENDING,
        attempts=[attempt],
        created_at=submitted_at,
        submitted_via=state.SubmittedVia.RAY,
    )
