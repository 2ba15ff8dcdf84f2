"""Hung-job detection on a real cluster (0 + 2 nodes, 2 Ray Train ranks, gloo on CPU), in one run:

- ``--hangs`` hangs injected into one run (rank 0 sleeps after 3 steps; action cancel restarts the run each time)
  with a ``--timeout`` hang timeout: ``detect_over_timeout_p95_s`` is the p95 of (detection - last progress -
  timeout), from the detections raypod recorded; ``diagnostics_s`` the slowest stack collection of them.
- healthy training (``--steps`` short steps) with the hang callback and without it (``RAY_TRAIN_CALLBACKS`` emptied
  in the job's runtime_env), alternating, twice each: ``step_time_overhead_pct`` compares the median step times;
  ``agent_cpu_pct`` is the CPU the agents used during the healthy runs, per agent, as a percent of one core;
  ``false_positives`` counts detections on the healthy runs, and on ``--healthy`` runs in a row whose slow start,
  slow checkpoint upload and paused evaluation each outlast the hang timeout (the suite runs one of those).

Usage: python benchmarks/hangwatch.py [--hangs 10] [--timeout 20] [--steps 100] [--healthy 5]
Last line: one JSON object. Goals: detect_over_timeout_p95_s <= 5, false_positives 0, agent_cpu_pct <= 1,
step_time_overhead_pct <= 1, diagnostics_s <= 10.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import psutil
from _common import percentile, raypod_server

from raypod import spec as spec_mod
from raypod import state
from raypod.backends import local
from raypod.client import Client

SCRIPT = Path(__file__).parents[1] / "tests" / "e2e" / "scripts" / "hangwatch_script.py"


def agents(uid: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter():
        try:
            is_agent = "raypod.capabilities.hangwatch.agent" in " ".join(process.cmdline())
            if is_agent and process.environ().get(local.CLUSTER_MARKER) == uid:
                found.append(process)
        except psutil.Error:
            continue
    return found


def cpu_seconds(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            continue
    return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hangs", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=20.0)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--healthy", type=int, default=5, help="runs with slow phases longer than the timeout")
    args = parser.parse_args()
    spec = {
        "name": "hangbench",
        "head": {"cpus": 0, "memory": "512Mi", "object_store_memory": "80Mi"},
        "worker_groups": [{"name": "cpu", "replicas": 2, "cpus": 1, "memory": "1Gi", "object_store_memory": "100Mi"}],
        "hangwatch": {"timeout": args.timeout, "start_timeout": "120s", "action": "cancel"},
    }
    with raypod_server("raypod-hangwatch-") as server:
        os.environ.update({k: v for k, v in server.env.items() if k.startswith("RAYPOD_")})
        with Client() as api:
            api.clusters.create(spec)
            view = api.clusters.wait_ready("hangbench", timeout=300)
            uri = api.jobs.upload_working_dir("hangbench", [("s/hangwatch_script.py", SCRIPT.read_bytes())])

            def run(args_text: str, runtime_env: dict[str, object] | None = None) -> state.JobView:
                job = api.jobs.submit(
                    "hangbench",
                    spec_mod.JobSpec(
                        entrypoint=f"python hangwatch_script.py {args_text}",
                        runtime_env={"working_dir": uri, **(runtime_env or {})},
                    ),
                )
                finished = api.jobs.wait(job.id, timeout=3600)
                if finished.status is not state.JobStatus.SUCCEEDED:
                    sys.exit(f"job {job.id} {finished.status.value}:\n{api.jobs.logs(job.id)[-3000:]}")
                return finished

            steps: dict[str, list[float]] = {"with": [], "without": []}
            healthy = []
            agent_cpu, wall = 0.0, 0.0
            for _ in range(2):
                for mode in ("without", "with"):
                    env = {"env_vars": {"RAY_TRAIN_CALLBACKS": ""}} if mode == "without" else None
                    watched = agents(view.uid)
                    cpu_before, started = cpu_seconds(watched), time.monotonic()
                    job = run(f"steady {args.steps}", env)
                    agent_cpu += cpu_seconds(watched) - cpu_before
                    wall += (time.monotonic() - started) * max(1, len(watched))
                    # Printed by rank 0: Ray prefixes the line with the worker's name in the job's log.
                    line = next(li for li in api.jobs.logs(job.id).splitlines() if "STEPS [" in li)
                    steps[mode].extend(json.loads(line.split("STEPS ", 1)[1])[5:])
                    healthy.append(job)
            if args.healthy:
                slow = {"env_vars": {"PHASE_S": str(args.timeout + 4)}}
                healthy.append(run(f"healthy {args.healthy}", slow))
            false_positives = sum(len(api.jobs.hangs("hangbench", job.id)) for job in healthy)

            hung = run(f"hangs {args.hangs}", {"env_vars": {"RUN_TAG": str(int(time.time()))}})
            detections = api.jobs.hangs("hangbench", hung.id, limit=1000)
            late = [
                (d.detected_at - d.last_progress).total_seconds() - (d.timeout_s or args.timeout)
                for d in detections
                if d.last_progress is not None
            ]
            per_hang = sorted(round(x, 2) for x in late)
            print(f"hangs injected: {args.hangs}, detected: {len(detections)}, over the timeout: {per_hang}")
            without, with_agent = statistics.median(steps["without"]), statistics.median(steps["with"])
            print(f"median step: without {without * 1000:.2f} ms, with {with_agent * 1000:.2f} ms")
            api.clusters.delete("hangbench")
            api.clusters.wait_deleted("hangbench", timeout=120)
    result = {
        "detect_over_timeout_p95_s": round(percentile(late, 95), 2) if late else None,
        "hangs_detected": len(detections),
        "hangs_injected": args.hangs,
        "false_positives": false_positives,
        "agent_cpu_pct": round(100 * agent_cpu / wall, 3) if wall else None,
        "step_time_overhead_pct": round(100 * (with_agent - without) / without, 2),
        "diagnostics_s": round(max((d.diagnostics_s or 0.0) for d in detections), 3) if detections else None,
        "timeout_s": args.timeout,
        "slow_phase_runs": args.healthy,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
