"""Hung-job detection on a real cluster (issue 14): 2 Ray Train ranks, gloo on CPU, one per worker node, each
node with its hangwatch agent. Tests assert on detections, events, processes and training results, waiting on
them with deadlines.

One server and one 0 + 2 node cluster for the module, with a short hang timeout (TIMEOUT_S) and a fast poll.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from raypod import spec as spec_mod
from raypod import state
from raypod.client import Client
from tests.e2e.conftest import (
    RaypodServer,
    assert_same_weights,
    cluster_processes,
    module_server,
    undisturbed_training_weights,
    wait_until,
)
from tests.e2e.test_gateway import ray_cli

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(900),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="py-spy and /proc are Linux's"),
]

SCRIPTS = Path(__file__).parent / "scripts"
TIMEOUT_S = 8.0
POLL_S = 1.0
HEALTHY_TIMEOUT_S = 4.0  # a job-level timeout (raypod.hang_timeout): the healthy run's phases need only outlast it
CLUSTER = {
    "name": "hw",
    "head": {"cpus": 0, "memory": "512Mi", "object_store_memory": "80Mi"},
    "worker_groups": [{"name": "cpu", "replicas": 2, "cpus": 1, "memory": "1Gi", "object_store_memory": "100Mi"}],
    "hangwatch": {"timeout": f"{TIMEOUT_S}s", "poll": POLL_S, "start_timeout": "90s"},
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RaypodServer]:
    with module_server(tmp_path_factory, "raypod-hangwatch") as started:
        yield started


@pytest.fixture(scope="module")
def cluster(server: RaypodServer) -> state.ClusterView:
    with server.client() as api:
        api.clusters.create(CLUSTER)
        return api.clusters.wait_ready("hw", timeout=240)


def submit(
    api: Client, script: str, args: str, metadata: dict[str, str] | None = None, env: dict[str, str] | None = None
) -> state.JobView:
    files = [(f"w/{name}", (SCRIPTS / name).read_bytes()) for name in (script,)]
    uri = api.jobs.upload_working_dir("hw", files)
    runtime_env: dict[str, object] = {"working_dir": uri, **({"env_vars": env} if env else {})}
    return api.jobs.submit(
        "hw",
        spec_mod.JobSpec(entrypoint=f"python {script} {args}", runtime_env=runtime_env, metadata=metadata or {}),
    )


def hangs_of(api: Client, job: state.JobView) -> list[state.HangDetection]:
    return api.jobs.hangs("hw", job.id)


def agents(uid: str) -> dict[str, psutil.Process]:
    found = {}
    for process in cluster_processes(uid):
        try:
            if "raypod.capabilities.hangwatch.agent" in " ".join(process.cmdline()):
                found[process.environ()["RAYPOD_NODE_NAME"]] = process
        except (psutil.Error, KeyError):
            continue
    return found


def test_a_stuck_rank_is_detected_with_every_ranks_stack_even_when_an_agent_is_killed(
    server: RaypodServer, cluster: state.ClusterView
) -> None:
    """Rank 0 sleeps in training, rank 1 blocks in the all-reduce: detected within the timeout and two polls,
    with both ranks' stacks; one node's agent is killed mid-hang and restarted without losing the timers."""
    with server.client() as api:
        job = submit(api, "hangwatch_script.py", "hang")
        ranks = wait_until(
            lambda: [r for run in api.jobs.training("hw") if run.job == job.id for r in run.ranks if r.reports >= 2],
            "two reports",
            180,
        )
        assert ranks
        before = agents(cluster.uid)
        assert set(before) == {"head", "cpu-0", "cpu-1"}, before
        victim = before["cpu-0"]
        wait_until(
            lambda: [
                r for run in api.jobs.training("hw") if run.job == job.id for r in run.ranks if (r.stalled_s or 0) > 2
            ],
            "the stall to start",
            60,
        )
        victim.kill()
        restarted = wait_until(
            lambda: (a := agents(cluster.uid).get("cpu-0")) is not None and a.pid != victim.pid and a, "agent back", 30
        )
        assert restarted.is_running()
        found = wait_until(lambda: [d for d in hangs_of(api, job) if len(d.ranks) == 2], "a detection", 90)[0]
        assert found.kind == "hang" and found.action == "notify"
        assert found.last_progress is not None
        late = (found.detected_at - found.last_progress).total_seconds() - TIMEOUT_S
        assert 0 <= late <= 2 * POLL_S + 2.5, f"detected {late:.1f} s after the timeout"
        assert {r.rank for r in found.ranks} == {0, 1}
        by_rank = {r.rank: r for r in found.ranks}
        assert "all_reduce" in (by_rank[1].waiting_in or ""), by_rank[1].stack
        assert "train_func" in (by_rank[0].stack or "") and "sleep" not in (by_rank[1].waiting_in or "")
        assert found.stalled_first and set(found.stalled_first) == {0, 1}
        assert any("rank 0 stops at step 3" in line for line in by_rank[0].log_tail)
        events = [e for e in api.clusters.events("hw", limit=1000) if e.reason == "JobHangDetected"]
        assert any(job.id in e.message for e in events), [e.message for e in events]
        logs = wait_until(lambda: "[raypod hangwatch] hang detected" in (t := api.jobs.logs(job.id)) and t, "log", 30)
        assert "no progress" in logs
        listed = ray_cli(server, "job", "list", "--address", "raypod://hw")
        assert listed.returncode == 0
        api.jobs.stop(job.id)


def test_cancel_restarts_the_run_from_its_checkpoint_with_the_result_of_an_undisturbed_run(
    server: RaypodServer, cluster: state.ClusterView
) -> None:
    with server.client() as api:
        hung = submit(api, "resilient_train_script.py", "stuck 8 0.2 4", {"raypod.hang_action": "cancel"})
        finished = api.jobs.wait(hung.id, timeout=400)
        logs = api.jobs.logs(hung.id)
        assert finished.status is state.JobStatus.SUCCEEDED, logs[-3000:]
        result = json.loads(next(li for li in reversed(logs.splitlines()) if li.startswith("RESULT "))[7:])
        assert result["step"] == 7
        assert_same_weights(result["weights"], undisturbed_training_weights(8))
        assert result["metrics"]["start"] >= 1, "the restarted run began from a checkpoint, not from scratch"
        [found] = hangs_of(api, hung)
        assert found.action == "cancel" and {r.rank for r in found.ranks} == {0, 1}


def test_healthy_runs_with_slow_starts_checkpoints_pauses_and_a_harmless_oom_line_are_left_alone(
    server: RaypodServer, cluster: state.ClusterView
) -> None:
    rules = json.dumps(
        [{"name": "oom", "log_pattern": "out of memory", "fault_on_match": False, "timeout_minutes": 60}]
    )
    """One run whose slow start, slow checkpoint upload and paused evaluation each last longer than its hang timeout
    (the job's own, HEALTHY_TIMEOUT_S, shorter than the cluster's: PHASE_S is twice the poll past it): a pause that
    did not reach the agent would be a detection, and with ``cancel`` a killed run (checked: with
    ``raypod.hangwatch.paused`` made a no-op, this fails). Five runs in a row are the benchmark's
    (benchmarks/hangwatch.py)."""
    metadata = {
        "raypod.hang_rules": rules,
        "raypod.hang_action": "cancel",
        "raypod.hang_timeout": f"{HEALTHY_TIMEOUT_S}s",
    }
    with server.client() as api:
        phase_s = HEALTHY_TIMEOUT_S + 2 * POLL_S + 1
        job = submit(api, "hangwatch_script.py", "healthy 1", metadata, env={"PHASE_S": str(phase_s)})
        finished = api.jobs.wait(job.id, timeout=600)
        assert finished.status is state.JobStatus.SUCCEEDED, api.jobs.logs(job.id)[-3000:]
        done = next(li for li in api.jobs.logs(job.id).splitlines() if li.startswith("DONE "))
        # The run's result carries the metrics of its checkpointed report (step 1): it ran to its end.
        assert [r["step"] for r in json.loads(done.removeprefix("DONE "))] == [1]
        assert hangs_of(api, job) == []


def test_a_fault_on_match_line_fails_the_run_at_once(server: RaypodServer, cluster: state.ClusterView) -> None:
    rules = json.dumps([{"name": "cuda-oom", "log_pattern": r"CUDA out of memory", "fault_on_match": True}])
    with server.client() as api:
        job = submit(api, "hangwatch_script.py", "oom", {"raypod.hang_rules": rules, "raypod.hang_action": "cancel"})
        finished = api.jobs.wait(job.id, timeout=300)
        assert finished.status is state.JobStatus.FAILED
        [found] = wait_until(lambda: hangs_of(api, job), "the fault", 30)
        assert found.kind == "fault" and found.rule == "cuda-oom" and found.ranks[0].rank == 1
        assert found.last_progress is not None
        # 12 steps of 0.3 s would take over 3 s more: the run ended at the fault, not at its end.
        assert "CUDA out of memory" in found.reason


def test_a_plain_ray_submission_with_a_bad_rule_is_refused_before_it_starts(
    server: RaypodServer, cluster: state.ClusterView
) -> None:
    bad = json.dumps({"raypod.hang_rules": json.dumps([{"name": "r1", "log_pattern": "(unclosed"}])})
    with server.client() as api:
        before = len(api.jobs.list("hw"))
    refused = ray_cli(
        server, "job", "submit", "--address", "raypod://hw", "--metadata-json", bad, "--no-wait", "--", "echo", "x"
    )
    assert refused.returncode != 0
    assert "r1" in refused.stderr + refused.stdout and "log_pattern" in refused.stderr + refused.stdout
    # Ray itself is asked (not raypod's importer, which runs every few seconds): the submission never reached it.
    listed = ray_cli(server, "job", "list", "--address", "raypod://hw")
    assert listed.returncode == 0 and "'echo x'" not in listed.stdout and "echo x" not in listed.stdout, listed.stdout
    with server.client() as api:
        assert len(api.jobs.list("hw")) == before
