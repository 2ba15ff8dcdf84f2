"""The job verbs the API calls: submit, list, get, stop, logs and working-dir upload."""

from __future__ import annotations

import builtins
import logging
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO, cast

import pydantic

from raypod import addons, errors, state
from raypod import spec as spec_mod
from raypod.backends import base, ray_jobs
from raypod.backends.kuberay import manifests
from raypod.controlplane import capacity, identity, store
from raypod.controlplane.clusters import ClusterService
from raypod.controlplane.history import History
from raypod.controlplane.jobs import packaging
from raypod.controlplane.jobs.attribution import Attribution
from raypod.controlplane.store.jobs import JobRecords

log = logging.getLogger(__name__)
# An attempt whose entrypoint never called ray.init: Ray ran nothing for it.
NO_DRIVER_SUMMARY: dict[str, Any] = {"tasks": {}, "actors": {}, "failed_tasks": [], "note": "no Ray driver ran"}


class JobService:
    """raypod jobs on a cluster's Ray job API, through the client the cluster's backend provides."""

    def __init__(self, clusters: ClusterService, packages_dir: Path | None = None) -> None:
        self.clusters = clusters
        self.records = JobRecords(clusters.store.engine)
        # Uploaded working dirs, kept per cluster: a cluster whose head restarts without GCS fault tolerance (a
        # preempted one, one whose head was replaced) loses them, and a later attempt uploads them again.
        self.packages_dir = packages_dir
        # Starts the supervisor's next pass at once; the control plane sets it to the supervisor's own.
        self.wake: Callable[[], None] = lambda: None
        # What the capabilities add to a cluster's nodes (a RayJob's cluster gets the same); the control plane sets
        # it to the reconciler's.
        self.addons_of: Callable[[str], Callable[[spec_mod.NodeSpec], addons.NodeAddons] | None] = lambda uid: None
        self.history: History | None = None  # where finished attempts' logs outlive the cluster
        # Signs who submitted a plain Ray job through the gateway; the control plane gives it the server's kept key.
        self.attribution = Attribution()
        # (namespace, cluster, start, end) -> the cluster's charts then; None: monitoring is off
        self.metrics_series: Callable[[str, str, float, float], dict[str, Any] | None] | None = None

    def submit(
        self,
        caller: identity.Principal,
        namespace: str,
        cluster: str,
        spec: spec_mod.JobSpec,
        *,
        job_id: str | None = None,
    ) -> state.JobView:
        """Store the job as PENDING; the supervisor submits it to Ray (its first attempt) on its next pass, which
        this starts at once. What can be told without Ray is refused here.

        Raises:
            Forbidden (not owner/team admin), NotFound, Conflict (no dashboard), InvalidSpec. A ``job_id`` stored
            before returns that job: nothing is submitted twice."""
        view = self.clusters.get(caller, namespace, cluster, identity.Verb.OPERATE)
        capacity.check_hangwatch(
            self.clusters.backend.features, spec_mod.hang_overrides_from_metadata(spec.metadata) is not None
        )
        spec = spec.model_copy(update={"runtime_env": {**view.spec.runtime_env, **spec.runtime_env}})
        if spec.as_rayjob:
            self._check_rayjob(spec)
        elif view.suspended:
            self.clusters.resume(caller, namespace, cluster)  # the job brings it back; submitted once it runs
        else:
            self.api(view)
        job = state.JobView(
            id=job_id or f"rj-{secrets.token_hex(5)}",
            namespace=namespace,
            cluster=cluster,
            owner=caller.user,
            spec=spec,
            status=state.JobStatus.PENDING,
            attempts=[],
            created_at=store.now(),
        )
        if not self.records.insert(job):  # ``job_id`` made before (a scheduled run: its id derives from its time)
            return self.records.load(job.id)
        self.wake()
        return job

    def rayjobs(self) -> base.RayJobRunner:
        """Raises InvalidSpec where the backend cannot run a RayJob."""
        backend = self.clusters.backend
        if not isinstance(backend, base.RayJobRunner):
            raise errors.InvalidSpec(
                "as_rayjob: a RayJob needs the Kubernetes backend (KubeRay); "
                "here jobs run through the cluster's job API"
            )
        return backend

    def _check_rayjob(self, spec: spec_mod.JobSpec) -> None:
        uploads = [str(v) for k, v in spec.runtime_env.items() if k in ("working_dir", "py_modules")]
        if any("gcs://" in value for value in uploads):
            raise errors.InvalidSpec(
                "runtime_env: a package uploaded to one cluster's GCS cannot reach a RayJob's new cluster; "
                "use a remote URI (s3://..., https://...)"
            )
        self.rayjobs()

    def submit_rayjob(self, view: state.ClusterView, job: state.JobView) -> None:
        """One RayJob on a cluster of its own shaped as ``view``'s: KubeRay submits and retries it."""
        runner = self.rayjobs()
        manifest = manifests.rayjob(
            view.spec,
            job.id,
            entrypoint=job.spec.entrypoint,
            runtime_env=job.spec.runtime_env,
            max_retries=job.spec.max_retries,
            shutdown_after_finish=not job.spec.keep_cluster,
            metadata={**job.spec.metadata, "raypod_job": job.id, "raypod_owner": job.owner},
            kueue=runner.kueue,
            node_addons=self.addons_of(view.uid),
        )
        runner.submit_rayjob(manifest)
        job.attempts.append(state.Attempt(submission_id=job.id, submitted_at=store.now()))

    def list(self, caller: identity.Principal, namespace: str, cluster: str) -> builtins.list[state.JobView]:
        """Jobs of a cluster, whether submitted through raypod or with plain Ray tooling (marked by origin)."""
        self.clusters.authorize(caller, identity.Verb.VIEW, namespace)
        return self.records.of_cluster(namespace, cluster)

    def get(self, caller: identity.Principal, job_id: str) -> state.JobView:
        """``job_id``: raypod's (``rj-...``) or Ray's submission id of one of its attempts (``raysubmit_...``).

        Raises:
            NotFound, the same for a job that does not exist and one the caller may not see."""
        job = self.records.load(job_id) if job_id.startswith("rj-") else self.records.by_submission(job_id)
        try:
            self.clusters.authorize(caller, identity.Verb.VIEW, job.namespace)
        except errors.Forbidden:
            raise errors.NotFound(f"job '{job_id[:40]}' not found") from None
        return job

    def stop(self, caller: identity.Principal, job_id: str) -> state.JobView:
        """Ask for the job to stop: the supervisor stops its running attempt (a RayJob: deletes it with its
        cluster) on its next pass, which this starts at once. A stopped job is never retried."""
        job = self.get(caller, job_id)
        self.clusters.get(caller, job.namespace, job.cluster, identity.Verb.OPERATE)
        self.records.request_stop(job.id)
        self.wake()
        return self.records.load(job.id)

    def request_failure(self, job_id: str, reason: str, cluster: state.ClusterView) -> None:
        """Ask for a job of ``cluster`` to fail for a reason raypod found there (a run that hangs again and again):
        the supervisor stops its attempt on Ray, never retries it, and makes the reason the attempt's message.

        Raises:
            NotFound: no such job on that cluster (what one cluster reports never touches another's jobs)."""
        job = self.records.load(job_id)
        if (job.namespace, job.cluster) != (cluster.spec.namespace, cluster.spec.name):
            raise errors.NotFound(f"job {job_id} not found on cluster {cluster.spec.namespace}/{cluster.spec.name}")
        if job.status not in state.FINISHED_JOB_STATUSES:
            self.records.request_stop(job_id, fail_reason=reason[:500])
            self.wake()

    def logs(self, caller: identity.Principal, job_id: str, attempt: int | None = None) -> str:
        """An attempt's driver log: from history once the attempt is over (also after its cluster is deleted),
        else from the cluster's Ray.

        Raises:
            NotFound: no such job or attempt; or its cluster is gone and its log was never archived."""
        job = self.get(caller, job_id)
        if not job.attempts:
            return ""
        index = len(job.attempts) if attempt is None else attempt
        if not 1 <= index <= len(job.attempts):
            raise errors.NotFound(f"job {job_id} has attempts 1..{len(job.attempts)}, not {index}")
        if job.spec.as_rayjob:
            return f"a RayJob's logs are in its submitter pod: kubectl -n {job.namespace} logs job/{job.id}\n"
        archived = self.history.attempt_logs(job, index) if self.history is not None else None
        if archived is not None:
            return archived
        try:
            view = self.clusters.store.get(job.namespace, job.cluster)
        except errors.NotFound:
            raise errors.NotFound(
                f"job {job_id}: cluster {job.namespace}/{job.cluster} is deleted and this attempt's log was not "
                "archived (it ended before history was kept, or the archive could not be written)"
            ) from None
        return self.api(view).logs(job.attempts[index - 1].submission_id)

    def search(
        self, caller: identity.Principal, namespace: str | None = None, limit: int = 500
    ) -> builtins.list[state.JobView]:
        """The newest jobs of every cluster the caller may view, deleted clusters' included, oldest first."""
        if namespace is not None:
            self.clusters.authorize(caller, identity.Verb.VIEW, namespace)
            namespaces: set[str] | None = {namespace}
        elif caller.is_admin:
            namespaces = None
        else:
            visible = self.clusters.identities.list_namespaces()
            namespaces = {ns.name for ns in visible if ns.team in caller.teams}
        return self.records.search(namespaces, limit)

    def archive_attempt(self, view: state.ClusterView, job: state.JobView, attempt: int) -> None:
        """Keep a finished attempt's driver log and the job's record (the supervisor, as the attempt ends)."""
        if self.history is None or job.spec.as_rayjob:
            return
        api = self.api(view, while_deleting=True)
        submission = job.attempts[attempt - 1].submission_id
        self.history.save_attempt(view.uid, job, attempt, api.logs(submission))
        try:  # what its tasks and actors did; the log is kept whether or not Ray's state API answers
            ray_job_id = str(api.info(submission).get("job_id") or "")
            found = api.job_summary(ray_job_id) if ray_job_id else {**NO_DRIVER_SUMMARY}
            self.history.save_attempt_record(view.uid, job, attempt, "summary", found)
        except errors.RaypodError as exc:
            log.info("job %s attempt %d: no task summary kept: %s", job.id, attempt, exc.message)
        if self.metrics_series is None:
            return
        started = job.attempts[attempt - 1].submitted_at.timestamp()
        try:  # the cluster's charts over the attempt, while Prometheus runs
            series = self.metrics_series(view.spec.namespace, view.spec.name, started, time.time())
            if series is not None:
                self.history.save_attempt_record(view.uid, job, attempt, "metrics", series)
        except errors.RaypodError as exc:
            log.info("job %s attempt %d: no metrics kept: %s", job.id, attempt, exc.message)

    def summary(self, caller: identity.Principal, job_id: str, attempt: int | None = None) -> dict[str, Any]:
        """What Ray's state API said of an ended attempt's tasks and actors (counts by state, failed tasks with
        their errors), as archived when it ended.

        Raises:
            NotFound: no such job or attempt, or no summary was kept (the attempt has not ended yet)."""
        return self._attempt_record(caller, job_id, attempt, "summary", "task summary")

    def metrics(self, caller: identity.Principal, job_id: str, attempt: int | None = None) -> dict[str, Any]:
        """Its cluster's charts (CPU, memory, object store, tasks per node; Ray Train when a run reported) over an
        ended attempt, as archived when it ended while Prometheus ran.

        Raises:
            NotFound: no such job or attempt, or none kept (not ended yet, or monitoring was off)."""
        return self._attempt_record(caller, job_id, attempt, "metrics", "metrics")

    def _attempt_record(
        self, caller: identity.Principal, job_id: str, attempt: int | None, kind: str, what: str
    ) -> dict[str, Any]:
        job = self.get(caller, job_id)
        index = len(job.attempts) if attempt is None else attempt
        found = self.history.attempt_record(job, index, kind) if self.history is not None and job.attempts else None
        if found is None:
            raise errors.NotFound(f"job {job_id}: no {what} kept for attempt {index} (kept when it ends)")
        return found

    def deleted_cluster(self, caller: identity.Principal, namespace: str, name: str) -> state.DeletedCluster:
        """The newest archive of a deleted cluster of that name: read-only, for whoever may view its namespace.

        Raises:
            NotFound: none archived (or kept no longer), the same for a namespace the caller may not view."""
        missing = f"no deleted cluster '{name}' of namespace '{namespace}' in history"
        team = self.clusters.identities.namespace_team(namespace)
        identity.authorize_hidden(caller, identity.Verb.VIEW, namespace, team, None, missing)
        record = self.history.deleted_cluster(namespace, name) if self.history is not None else None
        if record is None:
            raise errors.NotFound(missing)
        try:
            view = state.ClusterView.model_validate(record["view"])
            events = [state.Event.model_validate(event) for event in record["events"]]
        except (KeyError, pydantic.ValidationError) as exc:
            raise errors.NotFound(f"{missing}: its archive cannot be read ({type(exc).__name__})") from None
        known = self.records.known_ids(list(record.get("jobs", [])))
        jobs = [self.records.load(job_id) for job_id in record.get("jobs", []) if job_id in known]
        return state.DeletedCluster(archived_at=record["archived_at"], cluster=view, events=events, jobs=jobs)

    def archive_cluster(self, view: state.ClusterView) -> None:
        """Before a deleted cluster's nodes stop (the reconciler): every attempt's log not archived yet, while its
        Ray still answers, then the cluster's events and last view. An attempt whose log cannot be read is left
        out; the rest is kept."""
        if self.history is None:
            return
        jobs = self.records.of_cluster(view.spec.namespace, view.spec.name)
        for job in jobs:
            for index in range(1, len(job.attempts) + 1):
                if job.spec.as_rayjob or self.history.has_attempt(view.uid, job, index):
                    continue
                try:
                    self.archive_attempt(view, job, index)
                except errors.RaypodError as exc:
                    log.warning("job %s attempt %d: log not archived: %s", job.id, index, exc.message)
        events = self.clusters.store.events(view.spec.namespace, view.spec.name, 10_000)
        self.history.save_cluster(view, events, jobs)
        self.history.prune()

    def upload_working_dir(
        self,
        caller: identity.Principal,
        namespace: str,
        cluster: str,
        files: Sequence[tuple[str, packaging.Source]],
        limit: int = packaging.MAX_WORKING_DIR_BYTES,
    ) -> str:
        """Zip uploaded files (relative paths, as a browser sends a picked folder) into a Ray package on the
        cluster's GCS, and return its ``gcs://`` URI for ``runtime_env.working_dir``. The zip is spooled to disk
        and streamed to Ray: nothing is held whole in memory.

        Raises:
            InvalidSpec: no files, an unsafe path, or too many bytes. Forbidden, NotFound, Conflict.
        """
        view = self.clusters.get(caller, namespace, cluster, identity.Verb.OPERATE)
        if self.packages_dir is None:
            with tempfile.SpooledTemporaryFile(max_size=packaging.CHUNK_BYTES) as spooled:
                package = cast(BinaryIO, spooled)
                name = packaging.write_package(files, package, limit)
                self.api(view).upload_package(name, package)
            return f"gcs://{name}"
        self._forget_packages_of_gone_clusters()
        kept = self.packages_dir / view.uid
        kept.mkdir(parents=True, exist_ok=True, mode=0o700)
        with tempfile.NamedTemporaryFile(dir=kept, prefix=".upload-", delete=False) as written:
            try:
                name = packaging.write_package(files, cast(BinaryIO, written), limit)
                self.api(view).upload_package(name, cast(BinaryIO, written))
            except BaseException:
                os.unlink(written.name)
                raise
        os.replace(written.name, kept / name)
        return f"gcs://{name}"

    def _restore_packages(self, view: state.ClusterView, job: state.JobView) -> None:
        """Upload again the working dir a later attempt needs, if the cluster lost it and raypod kept it."""
        if self.packages_dir is None:
            return
        uri = str(job.spec.runtime_env.get("working_dir") or "")
        name = uri.removeprefix("gcs://")
        kept = self.packages_dir / view.uid / name
        if not uri.startswith("gcs://") or "/" in name or not kept.is_file():
            return
        api = self.api(view)
        if not api.package_exists(name):
            with open(kept, "rb") as package:
                api.upload_package(name, package)

    def _forget_packages_of_gone_clusters(self) -> None:
        assert self.packages_dir is not None
        if not self.packages_dir.is_dir():
            return
        known = {view.uid for view in self.clusters.store.list()}
        for folder in self.packages_dir.iterdir():
            if folder.is_dir() and folder.name not in known:
                shutil.rmtree(folder, ignore_errors=True)

    def authorize_upload(self, caller: identity.Principal, namespace: str, cluster: str) -> None:
        """Raises what ``upload_working_dir`` would for the caller's rights, before any byte is read."""
        self.clusters.get(caller, namespace, cluster, identity.Verb.OPERATE)

    def submit_attempt(self, view: state.ClusterView, job: state.JobView) -> None:
        """Submit the job's next attempt to Ray under a submission id of its own (``<job>-<attempt>``).

        Raises:
            InvalidSpec: Ray refused it. An attempt Ray already has (the server stopped after Ray took it and
            before the record said so) is not refused: it is recorded and followed."""
        submission_id = f"{job.id}-{len(job.attempts) + 1}"
        if job.attempts:
            self._restore_packages(view, job)
        body = {
            "entrypoint": job.spec.entrypoint,
            "submission_id": submission_id,
            "runtime_env": job.spec.runtime_env or None,
            "metadata": {**job.spec.metadata, "raypod_job": job.id, "raypod_owner": job.owner},
        }
        api = self.api(view)
        try:
            api.submit(body)
        except errors.InvalidSpec as refusal:
            try:
                api.info(submission_id)
            except errors.NotFound:
                raise refusal from None
        job.attempts.append(state.Attempt(submission_id=submission_id, submitted_at=store.now()))
        job.status, job.next_attempt_at = state.JobStatus.PENDING, None

    def api(self, view: state.ClusterView, *, while_deleting: bool = False) -> ray_jobs.RayJobApi:
        """Raises Conflict while the cluster has no running dashboard (or is being deleted, unless
        ``while_deleting``: history reads its jobs' logs before its nodes stop)."""
        url = view.status.endpoints.get("dashboard")
        if not url or (view.deleting and not while_deleting):
            raise errors.Conflict(f"cluster {view.spec.namespace}/{view.spec.name} has no running dashboard yet")
        return self.clusters.backend.job_api(view.uid, url)
