"""A cluster that grows from Ray's own demand and shrinks when its nodes idle, with a real raypod server, real Ray
nodes and an unchanged Ray Train script: the scale-up waits for quota with its reason and goes on when quota frees,
a demand no node can ever hold is reported once and not scaled for, idle nodes go after ``idle_timeout_s``, and the
idle cluster is suspended after ``suspend_after_idle_s`` and brought back by a submitted job."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raypod import spec as spec_mod
from raypod import state
from raypod.client import Client
from tests.e2e.conftest import RaypodServer, module_server, wait_until
from tests.e2e.test_gateway import run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

SCRIPTS = Path(__file__).parent / "scripts"
SMALL = {"memory": "512Mi", "object_store_memory": "80Mi"}
IDLE_TIMEOUT_S = 3
SUSPEND_AFTER_S = 12
INFEASIBLE = "import ray, time; ray.init(); ray.remote(num_cpus=64)(lambda: 1).remote(); time.sleep(600)"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RaypodServer]:
    with module_server(tmp_path_factory, "raypod-autoscaling") as started:
        yield started


def cli(server: RaypodServer, *args: str) -> str:
    done = run_cli(server, "raypod", *args)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def reasons(api: Client, name: str, namespace: str) -> list[str]:
    return [e.reason for e in api.clusters.events(name, namespace, limit=1000)]


def pending(api: Client, name: str, namespace: str) -> list[state.PendingDemand]:
    found = api.clusters.get(name, namespace).status.autoscaling
    return found.pending if found is not None else []


def test_a_train_run_grows_the_cluster_within_quota_and_idle_nodes_go(server: RaypodServer) -> None:
    cli(server, "team", "create", "auto")
    cli(server, "namespace", "create", "auto", "--team", "auto")
    cli(server, "quota", "set", "auto", "--cpus", "1")
    spec = {
        "name": "grow",
        "namespace": "auto",
        "head": {"cpus": 0, **SMALL},
        "worker_groups": [{"name": "cpu", "replicas": 1, "min_replicas": 1, "max_replicas": 2, "cpus": 1, **SMALL}],
        "autoscaling": {"idle_timeout_s": IDLE_TIMEOUT_S},
        "suspend_after_idle_s": SUSPEND_AFTER_S,
    }
    with server.client() as api:
        api.clusters.create(spec)
        api.clusters.wait_ready("grow", "auto", timeout=180)
        # A task no node of any group can hold: reported once, never scaled for. Meanwhile the unchanged
        # two-worker Ray Train script on a one-worker cluster asks for a scale-up over the team's quota: it waits
        # with its reason and the cluster keeps its size.
        impossible = api.jobs.submit("grow", spec_mod.JobSpec(entrypoint=f'python -c "{INFEASIBLE}"'), "auto")
        script = (SCRIPTS / "train_script.py").read_bytes()
        uri = api.jobs.upload_working_dir("grow", [("run/train_script.py", script)], "auto")
        job = api.jobs.submit(
            "grow", spec_mod.JobSpec(entrypoint="python train_script.py", runtime_env={"working_dir": uri}), "auto"
        )
        waiting = wait_until(
            lambda: [d for d in pending(api, "grow", "auto") if d.reason.startswith("over quota")],
            "the scale-up to wait for quota",
            120,
        )
        assert "team auto is at its quota" in waiting[0].reason and waiting[0].placement_group, waiting
        wait_until(lambda: "InfeasibleDemand" in reasons(api, "grow", "auto"), "the infeasible demand reported", 60)
        api.jobs.stop(impossible.id)
        view = api.clusters.get("grow", "auto")
        assert view.pending_spec is not None and view.spec.group("cpu").replicas == 1
        shown = cli(server, "cluster", "get", "grow", "-n", "auto")
        assert "over quota" in shown and "placement group" in shown, shown

        cli(server, "quota", "set", "auto", "--cpus", "2")
        done = api.jobs.wait(job.id, timeout=300)
        assert done.status is state.JobStatus.SUCCEEDED, api.jobs.logs(job.id)[-3000:]
        assert "train-finished True" in api.jobs.logs(job.id)
        events = api.clusters.events("grow", "auto", limit=1000)
        scaled_up = [e for e in events if e.reason in ("ScaledUp", "ScaleQueued")]
        assert scaled_up and "1 -> 2 replicas" in scaled_up[0].message and "pending demand" in scaled_up[0].message
        assert "ScaleAdmitted" in [e.reason for e in events]
        # The impossible task asked for nothing: never more than the two workers the run needed.
        nodes = api.clusters.get("grow", "auto").status.nodes
        assert all(n.group != "cpu" or n.name in ("cpu-0", "cpu-1") for n in nodes), nodes

        # Idle nodes go after idle_timeout_s, down to min_replicas, and the quota is given back at once.
        idle_since = time.monotonic()
        wait_until(lambda: api.clusters.get("grow", "auto").spec.group("cpu").replicas == 1, "the scale-down", 60)
        gone = wait_until(
            lambda: all(n.name != "cpu-1" for n in api.clusters.get("grow", "auto").status.nodes), "cpu-1 gone", 60
        )
        assert gone and time.monotonic() - idle_since < IDLE_TIMEOUT_S + 30
        down = [e for e in api.clusters.events("grow", "auto", limit=1000) if e.reason == "ScaledDown"]
        assert down and "idle for over 3 s: cpu-1" in down[-1].message
        infeasible = [
            e.message for e in api.clusters.events("grow", "auto", limit=1000) if e.reason == "InfeasibleDemand"
        ]
        assert infeasible and len(set(infeasible)) == len(infeasible), infeasible  # each demand once
        assert any("CPU" in message for message in infeasible), infeasible
        usage = json.loads(cli(server, "quota", "get", "auto", "-o", "json"))
        assert usage["usage"]["cpus"] == 1, usage

        # With nothing running for suspend_after_idle_s the cluster is suspended: no node, no quota held; a job
        # submitted to it brings it back and runs.
        suspended = wait_until(
            lambda: api.clusters.get("grow", "auto").status.phase is state.ClusterPhase.SUSPENDED, "suspension", 90
        )
        assert suspended
        wait_until(lambda: not api.clusters.get("grow", "auto").status.nodes, "every node stopped", 60)
        usage = json.loads(cli(server, "quota", "get", "auto", "-o", "json"))
        assert usage["usage"].get("cpus", 0) == 0, usage
        again = api.jobs.submit("grow", spec_mod.JobSpec(entrypoint="echo back-again"), "auto")
        assert api.jobs.wait(again.id, timeout=180).status is state.JobStatus.SUCCEEDED
        assert "back-again" in api.jobs.logs(again.id)
        assert {"Suspended", "Resumed"} <= set(reasons(api, "grow", "auto"))
