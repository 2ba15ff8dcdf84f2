"""The SDK's jobs: submissions, their attempts, logs and hang detections."""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import Any

from raypod import spec as spec_mod
from raypod import state
from raypod.client._calls import checked_job_id, namespaced_path, poll
from raypod.client._http import Transport


class Jobs:
    """Job verbs; names match ``raypod job submit|list|get|logs|stop`` and ``/api/v1/.../jobs``."""

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def submit(
        self, cluster: str, spec: spec_mod.JobSpec | dict[str, Any], namespace: str = "default"
    ) -> state.JobView:
        """Submit a raypod job (retried ``max_retries`` times after a FAILED attempt)."""
        body = spec.model_dump(mode="json") if isinstance(spec, spec_mod.JobSpec) else spec
        return state.JobView.model_validate(
            self._t.request("POST", namespaced_path(namespace, cluster, "jobs"), json=body)
        )

    def list(self, cluster: str, namespace: str = "default") -> builtins.list[state.JobView]:
        """Every job of a cluster, those submitted with plain Ray tooling included (``submitted_via``)."""
        return [
            state.JobView.model_validate(j) for j in self._t.request("GET", namespaced_path(namespace, cluster, "jobs"))
        ]

    def list_all(self, namespace: str | None = None, limit: int = 500) -> builtins.list[state.JobView]:
        """The newest jobs of every cluster the caller may view (of ``namespace``), deleted clusters' included."""
        params: dict[str, Any] = {"limit": limit}
        if namespace is not None:
            params["namespace"] = namespace
        return [state.JobView.model_validate(j) for j in self._t.request("GET", "/api/v1/jobs", params=params)]

    def summary(self, job_id: str, attempt: int | None = None) -> dict[str, Any]:
        """An ended attempt's tasks and actors by state, and its failed tasks with their errors (from history)."""
        params = {"attempt": attempt} if attempt is not None else {}
        found: dict[str, Any] = self._t.request("GET", f"/api/v1/jobs/{job_id}/summary", params=params)
        return found

    def metrics(self, job_id: str, attempt: int | None = None) -> dict[str, Any]:
        """Its cluster's charts over an ended attempt (from history; kept while Prometheus ran)."""
        params = {"attempt": attempt} if attempt is not None else {}
        found: dict[str, Any] = self._t.request("GET", f"/api/v1/jobs/{job_id}/metrics", params=params)
        return found

    def get(self, job_id: str) -> state.JobView:
        return state.JobView.model_validate(self._t.request("GET", f"/api/v1/jobs/{checked_job_id(job_id)}"))

    def stop(self, job_id: str) -> state.JobView:
        return state.JobView.model_validate(self._t.request("POST", f"/api/v1/jobs/{checked_job_id(job_id)}/stop"))

    def logs(self, job_id: str, attempt: int | None = None) -> str:
        params = {"attempt": attempt} if attempt else {}
        payload = self._t.request("GET", f"/api/v1/jobs/{checked_job_id(job_id)}/logs", params=params)
        return state.JobLogs.model_validate(payload).logs

    def hangs(
        self, cluster: str, job: str | None = None, namespace: str = "default", limit: int = 100
    ) -> builtins.list[state.HangDetection]:
        """Hung or faulted Ray Train runs of a cluster (of one job), newest first, with each rank's stack."""
        params: dict[str, Any] = {"limit": limit, **({"job": checked_job_id(job)} if job else {})}
        found = self._t.request("GET", namespaced_path(namespace, cluster, "hangs"), params=params)
        return [state.HangDetection.model_validate(d) for d in found]

    def training(self, cluster: str, namespace: str = "default") -> builtins.list[state.RunProgress]:
        """Live Ray Train runs of a cluster, each rank's progress as the nodes' agents see it."""
        return [
            state.RunProgress.model_validate(r)
            for r in self._t.request("GET", namespaced_path(namespace, cluster, "training"))
        ]

    def upload_working_dir(
        self, cluster: str, files: builtins.list[tuple[str, bytes]], namespace: str = "default"
    ) -> str:
        """Upload files (paths relative to a folder) as a Ray package; returns its ``gcs://`` URI."""
        upload = [("files", (name, data)) for name, data in files]
        payload = self._t.request("POST", namespaced_path(namespace, cluster, "working-dirs"), files=upload)
        return state.WorkingDir.model_validate(payload).uri

    def wait(
        self,
        job_id: str,
        timeout: float = 3600.0,
        on_progress: Callable[[state.JobView], None] | None = None,
    ) -> state.JobView:
        """Poll until the job succeeded, failed or stopped.

        Raises:
            TransientError: still running after ``timeout``.
        """
        return poll(
            lambda: self.get(job_id),
            lambda job: job.status in TERMINAL_JOB_STATUSES,
            timeout=timeout,
            every=0.5,
            on_progress=on_progress,
            late=lambda job: f"job {job_id} still {job.status.value} after {timeout:.0f} s",
        )


TERMINAL_JOB_STATUSES = frozenset({state.JobStatus.SUCCEEDED, state.JobStatus.FAILED, state.JobStatus.STOPPED})
