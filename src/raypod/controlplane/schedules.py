"""Scheduled jobs: a job spec submitted to a cluster at the times a cron expression names (docs/schedules.md).

The runner (a loop beside the job supervisor) submits each due run as its owner would, through ``JobService``, so a
run is a job like any other (its logs in history, a suspended cluster resumed by it). A run's job id is derived from
the schedule and the scheduled time, and stored before the schedule notes that time: a server killed between the
two makes the same id again after its restart, which the store refuses, so no time ever runs twice; times missed
while the server was down run once, for the latest of them.
"""

from __future__ import annotations

import builtins
import hashlib
import logging
from datetime import datetime

from raypod import errors, state
from raypod import spec as spec_mod
from raypod.controlplane import identity, store
from raypod.controlplane.jobs import JobService
from raypod.controlplane.periodic import Periodic
from raypod.controlplane.store.schedules import ScheduleStore

log = logging.getLogger(__name__)

SCHEDULE_KEY = "raypod.schedule"  # a run's job metadata: <namespace>/<name> of its schedule
SCHEDULED_FOR_KEY = "raypod.scheduled_for"


def run_id(spec: spec_mod.ScheduleSpec, scheduled_for: datetime) -> str:
    digest = hashlib.sha256(f"{spec.namespace}/{spec.name}@{scheduled_for.isoformat()}".encode()).hexdigest()
    return f"rj-{digest[:10]}"


class ScheduleService:
    def __init__(self, jobs: JobService) -> None:
        self.jobs = jobs
        self.records = ScheduleStore(jobs.clusters.store.engine)

    def create(self, caller: identity.Principal, spec: spec_mod.ScheduleSpec) -> state.ScheduleView:
        """Raises Forbidden (may not operate the cluster), NotFound (no such cluster), AlreadyExists."""
        self.jobs.clusters.get(caller, spec.namespace, spec.cluster, identity.Verb.OPERATE)
        self.records.insert(spec, caller.user)
        return self.get(caller, spec.namespace, spec.name)

    def list(self, caller: identity.Principal, namespace: str | None = None) -> builtins.list[state.ScheduleView]:
        if namespace is not None:
            self.jobs.clusters.authorize(caller, identity.Verb.VIEW, namespace)
            return [self._with_runs(v) for v in self.records.list({namespace})]
        visible = None
        if not caller.is_admin:
            found = self.jobs.clusters.identities.list_namespaces()
            visible = {ns.name for ns in found if ns.team in caller.teams}
        return [self._with_runs(v) for v in self.records.list(visible)]

    def get(self, caller: identity.Principal, namespace: str, name: str) -> state.ScheduleView:
        self.jobs.clusters.authorize(caller, identity.Verb.VIEW, namespace)
        return self._with_runs(self.records.get(namespace, name))

    def set_suspended(
        self, caller: identity.Principal, namespace: str, name: str, suspended: bool
    ) -> state.ScheduleView:
        """Suspend (no run is made until it is resumed; times passed meanwhile are not run) or resume it."""
        view = self._operate(caller, namespace, name)
        self.records.save_spec(view.spec.model_copy(update={"suspended": suspended}))
        if not suspended:  # what passed while it was suspended is not owed
            self.records.fired(namespace, name, store.now(), "resumed")
        return self.get(caller, namespace, name)

    def delete(self, caller: identity.Principal, namespace: str, name: str) -> None:
        """Its runs stay (they are jobs); no new one is made."""
        self._operate(caller, namespace, name)
        self.records.delete(namespace, name)

    def _operate(self, caller: identity.Principal, namespace: str, name: str) -> state.ScheduleView:
        view = self.records.get(namespace, name)
        self.jobs.clusters.authorize(caller, identity.Verb.OPERATE, namespace, view.owner)
        return view

    def _with_runs(self, view: state.ScheduleView) -> state.ScheduleView:
        spec = view.spec
        mine = f"{spec.namespace}/{spec.name}"
        ran = self.jobs.records.of_cluster(spec.namespace, spec.cluster)
        runs = [job for job in ran if job.spec.metadata.get(SCHEDULE_KEY) == mine]
        after = view.last_scheduled_at or view.created_at
        return view.model_copy(
            update={
                "runs": runs[-spec.history_limit :] if spec.history_limit else [],
                "next_run_at": None if spec.suspended else spec_mod.schedules.next_time(spec.cron, after),
            }
        )


class ScheduleRunner(Periodic):
    """Makes the runs that are due, once a pass (every second)."""

    thread_name = "raypod-schedules"

    def __init__(self, schedules: ScheduleService, interval_s: float = 1.0) -> None:
        super().__init__(interval_s)
        self.schedules = schedules

    def run_once(self, now: datetime | None = None) -> None:
        moment = now or store.now()
        for view in self.schedules.records.list():
            if view.spec.suspended:
                continue
            due = spec_mod.schedules.last_due(view.spec.cron, view.last_scheduled_at or view.created_at, moment)
            if due is not None:
                try:
                    message = self._make_run(view, due)
                except errors.RaypodError as exc:
                    message = f"not run: {exc.message}"
                log.info("schedule %s/%s at %s: %s", view.spec.namespace, view.spec.name, due.isoformat(), message)
                self.schedules.records.fired(view.spec.namespace, view.spec.name, due, message)

    def _make_run(self, view: state.ScheduleView, due: datetime) -> str:
        spec = view.spec
        jobs = self.schedules.jobs
        mine = f"{spec.namespace}/{spec.name}"
        active = [
            job
            for job in jobs.records.of_cluster(spec.namespace, spec.cluster)
            if job.spec.metadata.get(SCHEDULE_KEY) == mine and job.status not in state.FINISHED_JOB_STATUSES
        ]
        owner = jobs.clusters.identities.principal(view.owner)
        if active and spec.concurrency_policy is spec_mod.ConcurrencyPolicy.FORBID:
            return f"skipped: run {active[-1].id} still runs (concurrency_policy Forbid)"
        if active and spec.concurrency_policy is spec_mod.ConcurrencyPolicy.REPLACE:
            for job in active:
                jobs.stop(owner, job.id)
        metadata = {**spec.job.metadata, SCHEDULE_KEY: mine, SCHEDULED_FOR_KEY: due.isoformat()}
        job_spec = spec.job.model_copy(update={"metadata": metadata})
        job_id = run_id(spec, due)
        if jobs.records.known_ids([job_id]):  # made before a restart that came before this time was noted
            return f"already run as {job_id}"
        made = jobs.submit(owner, spec.namespace, spec.cluster, job_spec, job_id=job_id)
        return f"run {made.id}"
