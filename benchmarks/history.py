"""What history costs: two clusters of the same shape on one raypod server, one that ran a job of 10,000 tasks (a
driver log of 10,000 lines), one that ran nothing, both deleted; and the job's log read from the archive against
the same log read from the cluster's live Ray job API through the same server.

- ``archive_delete_overhead_s``: delete -> gone, for the cluster with the job minus the cluster without one.
- ``archived_logs_read_ratio``: median time of ``GET /api/v1/jobs/<id>/logs`` (the archive) over the median of
  ``GET /clusters/<ns>/<name>/api/jobs/<submission>/logs`` (Ray's job API, through the gateway), 20 reads each, while
  the cluster still runs.
- ``resume_ratio``: a job submitted to a suspended cluster (which resumes it) -> the job RUNNING, over the same for a
  cluster created fresh (create -> ready -> submit -> RUNNING), same shape, same server.

Usage: python benchmarks/history.py [--tasks 10000]
Last line: one JSON object. Goals: archive_delete_overhead_s <= 1; archived_logs_read_ratio <= 1.2;
resume_ratio <= 1.5.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import httpx
from _common import raypod_server

from raypod import spec as spec_mod
from raypod import state
from raypod.client import Client
from raypod.client._http import tls_verify

SHAPE: dict[str, Any] = {"head": {"cpus": 1, "memory": "1Gi", "object_store_memory": "256Mi"}, "worker_groups": []}
DRIVER = (
    "import ray; ray.init(); f = ray.remote(num_cpus=0.01)(lambda i: i); "
    "[print(f'task {i} done', flush=False) for i in ray.get([f.remote(i) for i in range({tasks})])]"
)
READS = 20


def delete_seconds(api: Client, name: str) -> float:
    started = time.perf_counter()
    api.clusters.delete(name)
    api.clusters.wait_deleted(name, timeout=300)
    return time.perf_counter() - started


def median_read(http: httpx.Client, path: str) -> float:
    times = []
    for _ in range(READS):
        started = time.perf_counter()
        answer = http.get(path)
        answer.raise_for_status()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def job_running_s(api: Client, name: str, started: float) -> float:
    job = api.jobs.submit(name, spec_mod.JobSpec(entrypoint="python -c 'import time; time.sleep(120)'"))
    deadline = time.monotonic() + 300
    while api.jobs.get(job.id).status is not state.JobStatus.RUNNING:
        assert time.monotonic() < deadline, f"the job on {name} never ran"
        time.sleep(0.1)
    seconds = time.perf_counter() - started
    api.jobs.stop(job.id)
    return seconds


def resume_and_fresh_s(api: Client) -> tuple[float, float]:
    """(a job submitted to a suspended cluster -> RUNNING, create a cluster -> a job RUNNING)."""
    api.clusters.create({"name": "sleepy", "suspend_after_idle_s": 2, **SHAPE})
    deadline = time.monotonic() + 300
    while (
        api.clusters.get("sleepy").status.phase is not state.ClusterPhase.SUSPENDED
        or api.clusters.get("sleepy").status.nodes
    ):
        assert time.monotonic() < deadline, "the idle cluster was never suspended"
        time.sleep(0.2)
    resumed = job_running_s(api, "sleepy", time.perf_counter())
    started = time.perf_counter()
    api.clusters.create({"name": "fresh", **SHAPE})
    api.clusters.wait_ready("fresh", timeout=300)
    fresh = job_running_s(api, "fresh", started)
    for name in ("sleepy", "fresh"):
        api.clusters.delete(name)
        api.clusters.wait_deleted(name, timeout=300)
    return resumed, fresh


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    args = parser.parse_args()
    with raypod_server("raypod-bench-history-") as server:
        os.environ.update({k: v for k, v in server.env.items() if k.startswith("RAYPOD_")})
        token = json.loads((server.home / "credentials").read_text())["token"]
        with Client() as api:
            for name in ("busy", "idle"):
                api.clusters.create({"name": name, **SHAPE})
            for name in ("busy", "idle"):
                api.clusters.wait_ready(name, timeout=300)
            entrypoint = 'python -c "' + DRIVER.replace("{tasks}", str(args.tasks)) + '"'
            job = api.jobs.submit("busy", spec_mod.JobSpec(entrypoint=entrypoint))
            job = api.jobs.wait(job.id, timeout=900)
            assert job.status is state.JobStatus.SUCCEEDED, api.jobs.logs(job.id)[-2000:]
            submission = job.attempts[-1].submission_id
            with httpx.Client(
                base_url=server.url,
                headers={"Authorization": f"Bearer {token}"},
                verify=tls_verify(str(server.home / "tls" / "ca.crt")),
                timeout=60,
            ) as http:
                archived = median_read(http, f"/api/v1/jobs/{job.id}/logs")
                live = median_read(http, f"/clusters/default/busy/api/jobs/{submission}/logs")
                size = len(http.get(f"/api/v1/jobs/{job.id}/logs").json()["logs"])
            busy_s = delete_seconds(api, "busy")
            idle_s = delete_seconds(api, "idle")
            after = api.jobs.logs(job.id)
            assert f"task {args.tasks - 1} done" in after, "the log was not read back after the deletion"
            resumed_s, fresh_s = resume_and_fresh_s(api)
    print(f"log of {size} bytes: archive {archived * 1000:.1f} ms, live {live * 1000:.1f} ms (median of {READS})")
    print(f"delete: with the job {busy_s:.2f} s, without {idle_s:.2f} s")
    print(f"a job running: on a suspended cluster {resumed_s:.2f} s, on a fresh one {fresh_s:.2f} s")
    print(
        json.dumps(
            {
                "tasks": args.tasks,
                "archive_delete_overhead_s": round(busy_s - idle_s, 3),
                "delete_with_job_s": round(busy_s, 3),
                "delete_without_job_s": round(idle_s, 3),
                "archived_logs_read_ms": round(archived * 1000, 2),
                "live_logs_read_ms": round(live * 1000, 2),
                "archived_logs_read_ratio": round(archived / live, 3),
                "log_bytes": size,
                "resume_to_job_running_s": round(resumed_s, 2),
                "fresh_to_job_running_s": round(fresh_s, 2),
                "resume_ratio": round(resumed_s / fresh_s, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
