"""History that outlives a cluster: each finished job attempt's driver log and record, and, before a deleted
cluster's nodes stop, its jobs' logs, its events and its last view, archived under a directory or any fsspec URL.

Layout, under the archive's root (``RAYPOD_HISTORY_URL``, default ``<home>/history``):

    <namespace>/<cluster>/<cluster uid>/cluster.json            the view, its events and job ids, when deleted
    <namespace>/<cluster>/<cluster uid>/jobs/<job id>/job.json  the job's record
    <namespace>/<cluster>/<cluster uid>/jobs/<job id>/<n>.log   attempt n's driver log
    <namespace>/<cluster>/<cluster uid>/jobs/<job id>/<n>.summary.json   its tasks and actors by state, failures

The archive is written by the loops (the job supervisor as attempts end; the reconciler before a deletion stops
nodes), read by requests. Clusters deleted more than the retention ago are pruned.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import timedelta
from typing import Any

from raypod import errors, state
from raypod.controlplane import store

log = logging.getLogger(__name__)


DEFAULT_MAX_LOG_BYTES = 16 * 2**20


class History:
    def __init__(
        self,
        url: str,
        options: dict[str, Any] | None = None,
        retention_days: float = 30.0,
        max_log_bytes: int = DEFAULT_MAX_LOG_BYTES,
    ) -> None:
        import fsspec

        self.url = url
        self.fs, self.root = fsspec.core.url_to_fs(url, **(options or {}))
        self.retention = timedelta(days=retention_days)
        # A job decides how much it prints: an attempt's archived log keeps its start and its end within this.
        self.max_log_bytes = max_log_bytes
        self._last_prune = 0.0

    # -- writing (the loops) ------------------------------------------------------------------------------

    def save_attempt(self, uid: str, job: state.JobView, attempt: int, logs: str) -> None:
        """Archive attempt ``attempt`` (1-based) of ``job``: its driver log, and the job's record."""
        folder = self._job_dir(uid, job)
        self._write(f"{folder}/{attempt}.log", bounded(logs.encode(), self.max_log_bytes))
        self._write(f"{folder}/job.json", job.model_dump_json().encode())

    def save_attempt_record(self, uid: str, job: state.JobView, attempt: int, kind: str, data: dict[str, Any]) -> None:
        """Archive what was read of an attempt besides its log: ``summary`` (Ray's state API on its tasks and
        actors) or ``metrics`` (its cluster's series over the attempt, while Prometheus runs)."""
        self._write(f"{self._job_dir(uid, job)}/{attempt}.{kind}.json", json.dumps(data).encode())

    def attempt_record(self, job: state.JobView, attempt: int, kind: str) -> dict[str, Any] | None:
        for folder in self._job_dirs(job):
            try:
                with self.fs.open(f"{folder}/{attempt}.{kind}.json", "rb") as found:
                    loaded: dict[str, Any] = json.loads(found.read())
                    return loaded
            except (FileNotFoundError, ValueError):
                continue
        return None

    def has_attempt(self, uid: str, job: state.JobView, attempt: int) -> bool:
        return bool(self.fs.exists(f"{self._job_dir(uid, job)}/{attempt}.log"))

    def save_cluster(self, view: state.ClusterView, events: list[state.Event], jobs: list[state.JobView]) -> None:
        """Archive a cluster about to be deleted: its last view, its events and which jobs it ran."""
        record = {
            "archived_at": store.now().isoformat(),
            "view": json.loads(view.model_dump_json()),
            "events": [json.loads(e.model_dump_json()) for e in events],
            "jobs": [job.id for job in jobs],
        }
        folder = self._cluster_dir(view.spec.namespace, view.spec.name, view.uid)
        self._write(f"{folder}/cluster.json", json.dumps(record).encode())

    # -- reading (requests) -------------------------------------------------------------------------------

    def attempt_logs(self, job: state.JobView, attempt: int) -> str | None:
        """The archived driver log of ``job``'s attempt, from whichever of the cluster's incarnations ran it."""
        for folder in self._job_dirs(job):
            path = f"{folder}/{attempt}.log"
            try:
                with self.fs.open(path, "rb") as found:
                    return bytes(found.read()).decode(errors="replace")
            except FileNotFoundError:
                continue
        return None

    def deleted_cluster(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The newest archived record of a deleted cluster of that name (``view``, ``events``, ``jobs``)."""
        newest: dict[str, Any] | None = None
        for path in self.fs.glob(f"{self.root}/{namespace}/{name}/*/cluster.json"):
            try:
                with self.fs.open(path, "rb") as found:
                    record = json.loads(found.read())
            except (OSError, ValueError):
                continue
            if newest is None or record["archived_at"] > newest["archived_at"]:
                newest = record
        return newest

    # -- retention ------------------------------------------------------------------------------------------

    def prune(self, every_s: float = 3600.0) -> int:
        """Remove clusters deleted more than the retention ago (at most once per ``every_s``); return how many."""
        if time.monotonic() - self._last_prune < every_s:
            return 0
        self._last_prune = time.monotonic()
        cutoff = (store.now() - self.retention).isoformat()
        removed = 0
        for path in self.fs.glob(f"{self.root}/*/*/*/cluster.json"):
            try:
                with self.fs.open(path, "rb") as found:
                    archived_at = json.loads(found.read())["archived_at"]
            except (OSError, ValueError, KeyError):
                continue
            if archived_at < cutoff:
                self.fs.rm(path.rsplit("/", 1)[0], recursive=True)
                removed += 1
        return removed

    # -- layout -----------------------------------------------------------------------------------------------

    def _cluster_dir(self, namespace: str, name: str, uid: str) -> str:
        return f"{self.root}/{namespace}/{name}/{uid}"

    def _job_dir(self, uid: str, job: state.JobView) -> str:
        return f"{self._cluster_dir(job.namespace, job.cluster, uid)}/jobs/{job.id}"

    def _job_dirs(self, job: state.JobView) -> list[str]:
        pattern = f"{self.root}/{job.namespace}/{job.cluster}/*/jobs/{job.id}/job.json"
        return [path.rsplit("/", 1)[0] for path in self.fs.glob(pattern)]

    def _write(self, path: str, data: bytes) -> None:
        try:
            self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
            with self.fs.open(path, "wb") as out:
                out.write(data)
        except OSError as exc:
            raise errors.TransientError(f"cannot write to the history archive {self.url}: {exc}") from exc


def bounded(log_bytes: bytes, limit: int) -> bytes:
    """The log within ``limit`` bytes: its first eighth and its end (where a failure is said), with a line saying
    how much was cut between them."""
    if len(log_bytes) <= limit:
        return log_bytes
    head = limit // 8
    cut = len(log_bytes) - limit
    marker = f"\n[raypod: {cut} bytes of this log were not archived; the archive keeps {limit} bytes of it]\n"
    return log_bytes[:head] + marker.encode() + log_bytes[len(log_bytes) - (limit - head) :]
