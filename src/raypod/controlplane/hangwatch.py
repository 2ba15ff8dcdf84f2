"""Hung Ray Train runs, as the control plane sees them: it reads what each node's hangwatch agent wrote, merges
the detections of one run from all its nodes into one record, and acts on it: an event, metrics, the webhook,
and, once a run has hung more times in a row than ``max_hang_restarts`` allows, failing its job with the reason.

The agents detect and cancel on their own (a hung rank is killed even while the server is down); this module
only reports and enforces the limit.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import hmac
import json
import logging
import re
import shutil
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from raypod import errors, outbound, state, untrusted_files
from raypod import spec as spec_mod
from raypod.capabilities.hangwatch import addons as hangwatch_addons
from raypod.capabilities.hangwatch import detector
from raypod.capabilities.observability import metrics
from raypod.controlplane import capacity, identity, keys, store
from raypod.controlplane.jobs.service import JobService
from raypod.controlplane.periodic import Periodic
from raypod.controlplane.store.hangwatch import HangStore
from raypod.outbound import Policy

log = logging.getLogger(__name__)

WEBHOOK_TIMEOUT_S = 5.0
STALE_POLLS = 3
STALE_SLACK_S = 2.0
COLLECT_PHASES = frozenset({state.ClusterPhase.READY, state.ClusterPhase.DEGRADED, state.ClusterPhase.UNKNOWN})


def merge(existing: state.HangDetection, found: state.HangDetection) -> state.HangDetection:
    """One run attempt's detection from several nodes: every rank once, the earliest times, the strongest action."""
    ranks = {rank.rank: rank for rank in existing.ranks}
    ranks.update({rank.rank: rank for rank in found.ranks})
    ordered = sorted(ranks.values(), key=lambda r: r.rank)
    stalled_first = [r.rank for r in sorted(ordered, key=lambda r: (r.last_report or 0.0, r.rank))]
    strength = {"notify": 0, "cancel": 1, "fail-job": 2}
    action = max(existing.action, found.action, key=lambda a: strength.get(a, 0))
    waits = {r.waiting_in.split(" ", 1)[0] for r in ordered if r.waiting_in}
    earliest = min((existing, found), key=lambda d: d.detected_at)
    return earliest.model_copy(
        update={
            "job": existing.job or found.job,
            "ranks": ordered,
            "stalled_first": stalled_first,
            "action": action,
            "hangs_without_progress": max(existing.hangs_without_progress, found.hangs_without_progress),
            "common_wait": waits.pop() if len(waits) == 1 and all(r.waiting_in for r in ordered) else None,
            "diagnostics_s": max(existing.diagnostics_s or 0.0, found.diagnostics_s or 0.0),
        }
    )


MAX_FILE_BYTES = 4 * 2**20
MAX_DETECTIONS_PER_PASS = 64  # per node directory: a flood of files is read over several passes


def from_agent(view: state.ClusterView, data: dict[str, Any], job: str | None, action: str) -> state.HangDetection:
    """An agent's detection file as a record. The file is untrusted (every process on the node can write it):
    its job and its action are the control plane's (``job``, ``action``), never the file's; its id is the run
    attempt's, the same from every node.

    Raises:
        ValueError: a field is missing or of the wrong type."""

    def when(value: Any) -> datetime | None:
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 2**33:
            return None
        return datetime.fromtimestamp(float(value), UTC)

    def text(value: Any, limit: int = 256) -> str | None:
        return None if value is None else str(value)[:limit]

    try:
        return state.HangDetection(
            id=f"{view.uid[:8]}-{str(data['run_id'])[:12]}-{str(data['attempt'])[:12]}-{str(data['kind'])[:16]}",
            namespace=view.spec.namespace,
            cluster=view.spec.name,
            job=job,
            ray_job_id=text(data.get("job_id"), 64),
            run=text(data.get("run")),
            run_id=str(data["run_id"])[:64],
            attempt=str(data["attempt"])[:64],
            kind=str(data["kind"])[:16],
            rule=text(data.get("rule")),
            reason=str(data.get("reason", ""))[:2000],
            action=action,
            detected_at=when(data.get("detected_at")) or store.now(),
            last_progress=when(data.get("last_progress")),
            timeout_s=data.get("timeout_s"),
            diagnostics_s=data.get("diagnostics_s"),
            hangs_without_progress=int(data.get("hangs_without_progress") or 1),
            common_wait=text(data.get("common_wait")),
            stalled_first=list(data.get("stalled_first") or [])[:4096],
            ranks=[state.HangRank.model_validate(rank) for rank in (data.get("ranks") or [])[:4096]],
        )
    except KeyError as exc:
        raise ValueError(f"missing field {exc}") from None
    except TypeError as exc:
        raise ValueError(str(exc)) from None


def request_id(run_id: str, attempt: str | None) -> str:
    return f"{run_id[:12]}-{(attempt or '')[:12]}-hang"


AGENT_TOKEN_PREFIX = "raypod-agent."
NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,120}\.json$")
MAX_REPORT_DETECTIONS = 16
# What one cluster's agents may leave on the server's disk: a job in a pod can read its agent's credential (same
# user, one process namespace), so its reports are bounded as anything a user writes.
MAX_REPORTING_NODES = 1024
MAX_KEPT_DETECTIONS = 256


class AgentReports:
    """Where the nodes' agents cannot share a directory with the server (Kubernetes' pods), they send what they
    write (``status.json``, ``detections/``) over HTTP with a credential of their cluster's, and take the control
    plane's requests back in the answer. Their files land in a directory per cluster and node here, read by the
    collector exactly as a local node's add-on directory; what is in them stays untrusted."""

    def __init__(self, home: Path) -> None:
        self.root = home / "hangwatch-agents"
        self._key_file = home / "hangwatch-agent.key"
        self._key: bytes | None = None
        self._lock = threading.Lock()

    def token(self, cluster_id: str) -> str:
        """The credential of one cluster's agents: it lets them report for that cluster and nothing else."""
        return f"{AGENT_TOKEN_PREFIX}{cluster_id}.{self._mac(cluster_id)}"

    def cluster_of(self, token: str) -> str | None:
        if not token.startswith(AGENT_TOKEN_PREFIX):
            return None
        cluster_id, _, mac = token.removeprefix(AGENT_TOKEN_PREFIX).partition(".")
        if not cluster_id or not hmac.compare_digest(mac, self._mac(cluster_id)):
            return None
        return cluster_id

    def receive(self, token: str, node: str, report: dict[str, Any]) -> dict[str, Any]:
        """Store an agent's report; answer the requests waiting for that node (each handed over once).

        Raises:
            Unauthenticated (not a cluster's agent credential), InvalidSpec (a node or file name, a size)."""
        cluster_id = self.cluster_of(token)
        if cluster_id is None:
            raise errors.Unauthenticated("not a hangwatch agent's credential")
        if not NODE_NAME.match(node):
            raise errors.InvalidSpec("a node is named as a pod: lowercase letters, digits, '-' and '.'")
        detections = report.get("detections") or {}
        status = report.get("status")
        if not isinstance(detections, dict) or len(detections) > MAX_REPORT_DETECTIONS:
            raise errors.InvalidSpec(f"detections: at most {MAX_REPORT_DETECTIONS} files, by name")
        for name, data in [("status.json", status), *detections.items()]:
            if data is not None and (not isinstance(data, dict) or not FILE_NAME.match(str(name))):
                raise errors.InvalidSpec(f"{str(name)[:130]}: a file is a JSON object named <name>.json")
        directory = self.root / cluster_id / node
        if not directory.is_dir() and len(self.dirs(cluster_id)) >= MAX_REPORTING_NODES:
            raise errors.TooManyRequests(f"more than {MAX_REPORTING_NODES} nodes report for this cluster")
        kept = set(untrusted_files.list_names(directory, "detections", ".json", MAX_KEPT_DETECTIONS))
        if len(kept | set(detections)) > MAX_KEPT_DETECTIONS:
            raise errors.TooManyRequests(f"a node keeps at most {MAX_KEPT_DETECTIONS} detections")
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        if status is not None:
            untrusted_files.write_json(directory, "status.json", status)
        for name, data in detections.items():
            untrusted_files.write_json(directory, f"detections/{name}", data)
        requests = {}
        for name in untrusted_files.list_names(directory, "requests", ".json", MAX_REPORT_DETECTIONS):
            found = untrusted_files.read_json(directory, f"requests/{name}", MAX_FILE_BYTES)
            with contextlib.suppress(OSError):
                (directory / "requests" / name).unlink()
            if found is not None:
                requests[name] = found
        return {"requests": requests}

    def dirs(self, cluster_id: str) -> dict[str, Path]:
        """The nodes that reported for the cluster, and the directory of each."""
        folder = self.root / cluster_id
        if not folder.is_dir():
            return {}
        return {child.name: child for child in folder.iterdir() if child.is_dir() and not child.is_symlink()}

    def forget(self, alive: set[str]) -> None:
        """The reports of clusters that are gone."""
        if self.root.is_dir():
            for child in self.root.iterdir():
                if child.name not in alive:
                    shutil.rmtree(child, ignore_errors=True)

    def _mac(self, cluster_id: str) -> str:
        with self._lock:  # the reconciler (making nodes' add-ons) and requests ask at once on a first start
            if self._key is None:
                self._key = keys.kept_key(self._key_file)
            key = self._key
        return hmac.new(key, f"hangwatch-agent:{cluster_id}".encode(), hashlib.sha256).hexdigest()[:43]


class HangCollector(Periodic):
    """A thread that collects every cluster's agents' reports each ``interval_s``."""

    thread_name = "raypod-hangs"

    def __init__(
        self,
        db: store.Store,
        jobs: JobService,
        interval_s: float = 1.0,
        outbound: Policy | None = None,
        reports: AgentReports | None = None,
    ) -> None:
        super().__init__(interval_s)
        self.reports = reports  # where agents report over HTTP (the backend shares no directory with the server)
        self.outbound = outbound or Policy()
        self.store = db
        self.jobs = jobs
        self.backend = jobs.clusters.backend
        self.records = HangStore(db.engine)
        self.progress: dict[str, list[state.RunProgress]] = {}
        self._seen: dict[Path, float] = {}  # detection file -> its mtime when merged
        self._requested: dict[str, str] = {}  # hang requests handed to agents: id -> the action decided
        self._hangs: dict[str, tuple[int, float]] = {}  # run id -> (hangs in a row, when the last one was)

    def run_once(self) -> None:
        self.collect_once()

    def collect_once(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        alive = set()
        for view in self.store.list():
            alive.add(view.uid)
            if view.deleting or view.status.phase not in COLLECT_PHASES:
                continue
            try:
                self._collect_cluster(view, now)
            except Exception:  # one cluster's files never stop the pass for the others
                log.exception("collecting the hang reports of cluster %s/%s", view.spec.namespace, view.spec.name)
        for uid in [uid for uid in self.progress if uid not in alive]:
            del self.progress[uid]
        if self.reports is not None:
            self.reports.forget(alive)

    def _collect_cluster(self, view: state.ClusterView, now: float) -> None:
        dirs = {node: found / hangwatch_addons.SUBDIR for node, found in self.backend.addon_dirs(view.uid).items()}
        if self.reports is not None:
            dirs.update(self.reports.dirs(view.uid))
        runs = self._progress(dirs, now)
        for run, places in runs:
            self._judge(view, run, places)
        self.progress[view.uid] = [run for run, _ in runs]
        metrics.HUNG_JOBS.labels(view.spec.name, view.spec.namespace).set(sum(1 for run, _ in runs if run.hung))
        for directory in dirs.values():
            for name in untrusted_files.list_names(directory, "detections", ".json", MAX_DETECTIONS_PER_PASS):
                self._collect(view, directory, name)

    def runs(self, uid: str) -> builtins.list[state.RunProgress]:
        return self.progress.get(uid, [])

    def of_job(
        self, caller: identity.Principal, job: state.JobView
    ) -> tuple[builtins.list[state.RunProgress], builtins.list[state.HangDetection]]:
        """A job's live Ray Train runs (per rank) and its hang detections, newest first; none once its cluster is
        gone."""
        try:
            view = self.jobs.clusters.get(caller, job.namespace, job.cluster)
        except errors.NotFound:
            return [], []
        runs = [run for run in self.runs(view.uid) if run.job == job.id]
        return runs, self.records.list(job.namespace, job.cluster, job.id, limit=20)

    def detections(
        self, caller: identity.Principal, namespace: str, cluster: str, job: str | None = None, limit: int = 100
    ) -> builtins.list[state.HangDetection]:
        """Hung or faulted Ray Train runs of a cluster (of one of its jobs), newest first, with every rank's stack.

        Raises:
            NotFound, Forbidden, InvalidSpec (no agent runs on this backend: no answer would read as 'no hang')."""
        self.jobs.clusters.get(caller, namespace, cluster, identity.Verb.VIEW)
        capacity.check_hangwatch(self.backend.features)
        return self.records.list(namespace, cluster, job, limit)

    def training(self, caller: identity.Principal, namespace: str, cluster: str) -> builtins.list[state.RunProgress]:
        """Live Ray Train runs of a cluster and each rank's progress, as the nodes' agents see it. Raises as
        ``detections``."""
        view = self.jobs.clusters.get(caller, namespace, cluster, identity.Verb.VIEW)
        capacity.check_hangwatch(self.backend.features)
        return self.runs(view.uid)

    def _progress(self, dirs: dict[str, Path], now: float) -> builtins.list[tuple[state.RunProgress, list[Path]]]:
        """Every run attempt the agents follow, its ranks from all nodes; a node whose agent has not written for
        a while contributes nothing (its ranks are unknown, so the run cannot be judged hung)."""
        runs: dict[tuple[str, str], tuple[state.RunProgress, list[Path]]] = {}
        for directory in dirs.values():
            status = untrusted_files.read_json(directory, "status.json", MAX_FILE_BYTES) or {}
            try:
                age = now - float(status.get("time") or 0.0)
                stale = age > STALE_POLLS * float(status.get("poll_s") or 2.0) + STALE_SLACK_S
                listed = status.get("runs") or []
            except (TypeError, ValueError):
                continue
            if stale or not isinstance(listed, list):
                continue
            for run in listed:
                try:
                    key = (str(run["run_id"]), str(run.get("attempt")))
                    ranks = [state.RankProgress.model_validate(r) for r in run.get("ranks") or []]
                    if key not in runs:
                        runs[key] = (
                            state.RunProgress(
                                run_id=key[0],
                                run=run.get("run"),
                                attempt=key[1],
                                ray_job_id=run.get("job_id"),
                                job=run.get("raypod_job"),
                                world_size=run.get("world_size"),
                                action=run.get("action"),
                                max_hang_restarts=run.get("max_hang_restarts"),
                                enabled=bool(run.get("enabled", True)),
                            ),
                            [],
                        )
                except (KeyError, ValueError, TypeError, AttributeError):
                    continue
                found, places = runs[key]
                for rank in ranks:
                    if rank.stalled_s is not None:
                        rank.stalled_s += max(0.0, age)  # as of now, not of the agent's last poll
                found.ranks = sorted([*found.ranks, *ranks], key=lambda r: r.rank)
                places.append(directory)
        return list(runs.values())

    def _judge(self, view: state.ClusterView, run: state.RunProgress, places: list[Path]) -> None:
        """Apply the no-progress verdict across the run's nodes; on a hang, hand it to the agents of those nodes,
        once per run attempt, with the action (notify, cancel, or fail-job after too many hangs in a row)."""
        views = [
            detector.RankView(r.rank, r.stalled_s, r.timeout_s or float("inf"), r.reports, r.last_progress or 0.0)
            for r in run.ranks
        ]
        verdict = detector.hang_verdict(views, run.world_size or len(views)) if run.enabled else None
        run.hung = verdict is not None
        count, since = self._hangs.get(run.run_id, (0, 0.0))
        if since and any((r.last_report or 0.0) > since for r in run.ranks):
            count, since = 0, 0.0  # progress since the last hang
        self._hangs[run.run_id] = (count, since)
        made = request_id(run.run_id, run.attempt)
        if verdict is None or made in self._requested:
            return
        count += 1
        self._hangs[run.run_id] = (count, time.time())
        settings = spec_mod.HangwatchSpec(
            action=spec_mod.HangAction(run.action or "notify"),
            max_hang_restarts=run.max_hang_restarts if run.max_hang_restarts is not None else 3,
        )
        action = detector.action_for(settings, count)
        request = {
            "run_id": run.run_id,
            "attempt": run.attempt,
            "kind": verdict.kind,
            "reason": verdict.reason,
            "ranks": verdict.ranks,
            "last_progress": verdict.last_progress,
            "timeout_s": verdict.timeout_s,
            "hangs_without_progress": count,
            "action": action,
        }
        self._requested[made] = action
        for directory in places:
            try:
                untrusted_files.write_json(directory, f"requests/{made}.json", request)
            except OSError as exc:  # a link the node put in the way: that node's agent is not asked
                log.warning("cannot hand hang request %s to %s: %s", made, directory.name, exc)
        if action == "fail-job":
            job = self._job_of(view, run.ray_job_id)
            if job is None:
                log.warning("run %s hung too often but its job is unknown; not failing it", run.run_id)
            else:
                self._fail_job(view, job, run.run or run.run_id, count, verdict.reason)

    def _collect(self, view: state.ClusterView, directory: Path, name: str) -> None:
        path = directory / "detections" / name
        try:
            mtime = path.lstat().st_mtime
        except OSError:
            return
        if self._seen.get(path) == mtime:
            return
        self._seen[path] = mtime
        data = untrusted_files.read_json(directory, f"detections/{name}", MAX_FILE_BYTES)
        if data is None:
            return
        try:
            run_id, attempt = str(data["run_id"]), str(data["attempt"])
            ray_job_id = data.get("job_id")
            job = self._job_of(view, ray_job_id if isinstance(ray_job_id, str) else None)
            count = max(1, int(data.get("hangs_without_progress") or 1))
            # The action is the control plane's: what it asked for, or what the job's own settings (the cluster's,
            # with the job's overrides from raypod's record) give for the agent's count of hangs in a row.
            action = self._requested.get(request_id(run_id, attempt)) or detector.action_for(
                self._settings(view, job), count
            )
            found = from_agent(view, data, job, action)
        except (KeyError, ValueError, TypeError) as exc:
            log.warning("ignoring an unreadable hang detection %s: %s", name[:80], exc)
            return
        merged, is_new = self.records.merge(view.uid, found, merge)
        if is_new:  # the first node's file of a run attempt; the others only add their ranks
            self._report(view, merged)
            if merged.action == "fail-job" and job is not None:
                self._fail_job(view, job, merged.run or merged.run_id, merged.hangs_without_progress, merged.reason)

    def _settings(self, view: state.ClusterView, job: str | None) -> spec_mod.HangwatchSpec:
        overrides = None
        if job is not None:
            with contextlib.suppress(errors.RaypodError, ValueError):
                overrides = spec_mod.hang_overrides_from_metadata(self.jobs.records.load(job).spec.metadata)
        return view.spec.hangwatch.merged(overrides)

    def _report(self, view: state.ClusterView, detection: state.HangDetection) -> None:
        name, namespace = view.spec.name, view.spec.namespace
        metrics.HANG_DETECTIONS.labels(name, namespace, detection.kind, detection.action).inc()
        if detection.last_progress is not None:
            metrics.HANG_DETECT_SECONDS.labels(name, namespace).observe(
                max(0.0, (detection.detected_at - detection.last_progress).total_seconds())
            )
        what = {"hang": "is hung", "rule": "broke a hang rule", "fault": "logged a fault"}.get(detection.kind, "hung")
        done = {
            "notify": "notified",
            "cancel": "hung ranks killed, Ray Train restarts the run from its last checkpoint",
            "fail-job": f"hung {detection.hangs_without_progress} times with no progress in between: job failed",
        }.get(detection.action, detection.action)
        message = (
            f"Ray Train run {detection.run or detection.run_id} (job {detection.job or detection.ray_job_id or '?'}) "
            f"{what}: {detection.reason}; {done}. Stacks: raypod job hangs {name}"
        )
        reason = "JobFaultDetected" if detection.kind == "fault" else "JobHangDetected"
        self.store.record(view, state.EventType.WARNING, reason, message[:2000], None)
        webhook = view.spec.hangwatch.webhook_url
        if webhook:
            threading.Thread(target=_post_webhook, args=(webhook, view, detection, self.outbound), daemon=True).start()

    def _job_of(self, view: state.ClusterView, ray_job_id: str | None) -> str | None:
        """The raypod job of one of this cluster's Ray jobs, from raypod's own records of this cluster: never a
        job id a file or a submission's metadata names (both are written by the cluster's users)."""
        if not ray_job_id:
            return None
        try:
            submissions = self.jobs.api(view).list()
        except errors.RaypodError:
            return None
        submission = next(
            (
                str(info["submission_id"])
                for info in submissions
                if info.get("job_id") == ray_job_id and info.get("submission_id")
            ),
            None,
        )
        if submission is None:
            return None
        for job in self.jobs.records.of_cluster(view.spec.namespace, view.spec.name):
            if any(attempt.submission_id == submission for attempt in job.attempts):
                return job.id
        return None

    def _fail_job(self, view: state.ClusterView, job: str, run: str, count: int, why: str) -> None:
        """Ask the job supervisor (the one writer of jobs) to fail the job."""
        reason = f"hangwatch: Ray Train run {run} hung {count} times with no progress in between: {why}"
        try:
            if self.jobs.records.load(job).status in state.FINISHED_JOB_STATUSES:
                return
            self.jobs.request_failure(job, reason, view)
        except errors.RaypodError as exc:
            log.warning("cannot fail job %s after repeated hangs: %s", job, exc)
            return
        self.store.record(view, state.EventType.WARNING, "JobFailedHung", reason[:2000], None)


def _post_webhook(url: str, view: state.ClusterView, detection: state.HangDetection, policy: Policy) -> None:
    """Through the outbound policy: a member's webhook never reaches the server's own or private network unless an
    operator allows it."""
    payload = {"event": "raypod.hang_detected", "detection": json.loads(detection.model_dump_json())}
    host = urlsplit(url).hostname
    try:
        with httpx.Client(timeout=WEBHOOK_TIMEOUT_S) as client:
            outbound.pinned_request(client, "POST", url, policy, json=payload).raise_for_status()
    except errors.RaypodError as exc:
        log.warning("hang webhook to %s refused: %s", host, exc)
    except httpx.HTTPError as exc:
        # The URL may carry a secret (a Slack webhook's path): log its host only.
        log.warning("hang webhook to %s failed: %s", host, type(exc).__name__)
