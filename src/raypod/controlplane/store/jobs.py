"""How raypod jobs are stored: one row per job, attempts as JSON (the table is in ``store/schema.py``)."""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa

from raypod import errors, state
from raypod import spec as spec_mod
from raypod.controlplane import store
from raypod.controlplane.store.schema import jobs


class JobRecords:
    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine

    def insert(self, job: state.JobView) -> bool:
        """Store a new job; returns False when one with its id exists already (imports are idempotent)."""
        try:
            with self.engine.begin() as connection:
                connection.execute(jobs.insert().values(**_row(job)))
        except sa.exc.IntegrityError:
            return False
        return True

    def load(self, job_id: str) -> state.JobView:
        with self.engine.connect() as connection:
            row = connection.execute(jobs.select().where(jobs.c.id == job_id)).first()
        if row is None:
            raise errors.NotFound(f"job '{job_id[:40]}' not found")
        return _view(row)

    def known_ids(self, ids: list[str]) -> set[str]:
        with self.engine.connect() as connection:
            return set(connection.execute(sa.select(jobs.c.id).where(jobs.c.id.in_(ids))).scalars())

    def of_cluster(self, namespace: str, cluster: str) -> list[state.JobView]:
        query = (
            jobs.select().where(jobs.c.namespace == namespace, jobs.c.cluster == cluster).order_by(jobs.c.created_at)
        )
        with self.engine.connect() as connection:
            return [_view(row) for row in connection.execute(query)]

    def search(self, namespaces: set[str] | None, limit: int) -> list[state.JobView]:
        """The newest ``limit`` jobs of ``namespaces`` (None: every one), whether their cluster exists or not."""
        query = jobs.select()
        if namespaces is not None:
            query = query.where(jobs.c.namespace.in_(sorted(namespaces)))
        with self.engine.connect() as connection:
            rows = connection.execute(query.order_by(jobs.c.created_at.desc()).limit(limit)).all()
        return [_view(row) for row in reversed(rows)]

    def active(self) -> list[state.JobView]:
        query = jobs.select().where(jobs.c.status.not_in([s.value for s in state.FINISHED_JOB_STATUSES]))
        with self.engine.connect() as connection:
            return [_view(row) for row in connection.execute(query)]

    def save(self, job: state.JobView) -> None:
        """Write the job's status and attempts, unless the stored job has ended meanwhile: an end is final, and a
        copy read before it (the supervisor's, while the hang collector failed the job) must not undo it."""
        row = _row(job)
        ended = [status.value for status in state.FINISHED_JOB_STATUSES]
        with self.engine.begin() as connection:
            connection.execute(
                jobs.update()
                .where(jobs.c.id == job.id, jobs.c.status.notin_(ended))
                .values(status=row["status"], attempts=row["attempts"], next_attempt_at=row["next_attempt_at"])
            )

    def by_submission(self, submission_id: str) -> state.JobView:
        """The job one of whose attempts is Ray's ``submission_id`` (what ``ray job submit`` printed).

        Raises:
            NotFound."""
        needle = json.dumps(submission_id)
        with self.engine.connect() as connection:
            rows = connection.execute(jobs.select().where(jobs.c.attempts.contains(needle))).all()
        for row in rows:
            job = _view(row)
            if any(attempt.submission_id == submission_id for attempt in job.attempts):
                return job
        raise errors.NotFound(f"job '{submission_id[:40]}' not found")

    def request_stop(self, job_id: str, fail_reason: str | None = None) -> None:
        """Ask the supervisor to stop the job (as FAILED, for ``fail_reason``): a request is all another thread
        writes of a job; its status and attempts have one writer."""
        values: dict[str, Any] = {"stop_requested": True}
        if fail_reason is not None:
            values["fail_requested"] = fail_reason
        with self.engine.begin() as connection:
            connection.execute(jobs.update().where(jobs.c.id == job_id).values(**values))


def _row(job: state.JobView) -> dict[str, Any]:
    return {
        "id": job.id,
        "namespace": job.namespace,
        "cluster": job.cluster,
        "owner": job.owner,
        "spec": job.spec.model_dump_json(),
        "status": job.status.value,
        "attempts": json.dumps([a.model_dump(mode="json") for a in job.attempts]),
        "stop_requested": job.stop_requested,
        "fail_requested": job.fail_requested,
        "next_attempt_at": job.next_attempt_at,
        "created_at": job.created_at,
        "submitted_via": job.submitted_via.value,
    }


def _view(row: sa.Row[tuple[object, ...]]) -> state.JobView:
    m = row._mapping
    return state.JobView(
        id=m["id"],
        namespace=m["namespace"],
        cluster=m["cluster"],
        owner=m["owner"],
        spec=spec_mod.JobSpec.model_validate_json(m["spec"]),
        status=state.JobStatus(m["status"]),
        attempts=[state.Attempt.model_validate(a) for a in json.loads(m["attempts"])],
        stop_requested=bool(m["stop_requested"]),
        fail_requested=m["fail_requested"],
        next_attempt_at=store.aware(m["next_attempt_at"]) if m["next_attempt_at"] else None,
        created_at=store.aware(m["created_at"]),
        submitted_via=state.SubmittedVia(m["submitted_via"]),
    )
