"""Real clusters through a real server: create, scale up, drain on scale down, node replacement, adoption
after kill -9 of the daemon, bad input that disturbs nothing, coexisting clusters, and clean deletion."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import psutil
import pytest

from raypod import errors, state
from raypod import spec as spec_mod
from raypod.backends import _ports
from raypod.client import Client
from tests.e2e.conftest import RaypodServer, cluster_processes, driver_env, run_driver
from tests.e2e.test_gateway import run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

SPEC = {
    "name": "e2e",
    "head": {"cpus": 1, "object_store_memory": "100Mi", "memory": "512Mi"},
    "worker_groups": [
        {
            "name": "cpu",
            "replicas": 1,
            "cpus": 1,
            "object_store_memory": "100Mi",
            "memory": "512Mi",
            "labels": {"team": "search"},
            "resources": {"disk": 1},
        },
    ],
    "env": {"E2E_MARKER": "hello"},
}


@pytest.fixture(scope="module")
def api(raypod_server: RaypodServer) -> Iterator[Client]:
    with raypod_server.client() as client:
        yield client


@pytest.fixture
def cluster(api: Client) -> state.ClusterView:
    """The module's cluster: created by the first test that needs it, and again after the test that deletes it
    (so the tests pass in any order)."""
    if "e2e" not in {view.spec.name for view in api.clusters.list()}:
        api.clusters.create(SPEC)
    return api.clusters.wait_ready("e2e", timeout=180)


EVERY_MINUTE = "every-minute"
MINE = f"default/{EVERY_MINUTE}"  # what a run's job metadata names its schedule by


def every_minute(api: Client) -> state.ScheduleView:
    """A schedule of the module's cluster that runs a short job each minute (the kill -9 test checks that none runs
    twice): made by the first test, so that by the kill test a run or two have usually been made already."""
    if EVERY_MINUTE not in {view.spec.name for view in api.schedules.list("default")}:
        job = {"entrypoint": "python -c pass"}
        api.schedules.create(
            {"name": EVERY_MINUTE, "cluster": "e2e", "cron": "* * * * *", "job": job, "concurrency_policy": "Forbid"}
        )
    return api.schedules.get(EVERY_MINUTE)


def node_processes(cluster_id: str) -> set[int]:
    """The pids of the cluster's node processes (raylets, GCS, dashboard, agents...): not the Ray workers and job
    drivers that come and go as jobs run (the schedule's runs, here)."""
    found = set()
    for process in cluster_processes(cluster_id):
        try:
            argv = process.cmdline()
        except psutil.Error:
            continue
        transient = any("default_worker.py" in a or a.startswith("ray::") for a in argv)
        if not transient and not " ".join(argv).endswith("-c pass"):
            found.add(process.pid)
    return found


def node(view: state.ClusterView, name: str) -> state.NodeStatus:
    return next(n for n in view.status.nodes if n.name == name)


def reasons(api: Client, name: str = "e2e") -> list[str]:
    return [event.reason for event in api.clusters.events(name, limit=1000)]


def wait_for_event(api: Client, reason: str, count: int = 1, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while reasons(api).count(reason) < count:
        assert time.monotonic() < deadline, f"no {reason} event: {reasons(api)}"
        time.sleep(0.25)


def test_created_cluster_runs_real_ray_nodes_with_the_spec(
    raypod_server: RaypodServer, api: Client, cluster: state.ClusterView
) -> None:
    every_minute(api)
    assert [n.name for n in cluster.status.nodes] == ["head", "cpu-0"]
    assert cluster.spec.owner == "admin"
    out = run_driver(
        raypod_server,
        cluster,
        """
import json, os, ray
ray.init()
nodes = [n for n in ray.nodes() if n["Alive"]]
@ray.remote(resources={"disk": 1})
def where():
    return os.environ.get("E2E_MARKER")
print(json.dumps({
    "labels": sorted(n["Labels"].get("ray.io/node-group") for n in nodes),
    "team": sorted(n["Labels"].get("team", "") for n in nodes),
    "cpus": ray.cluster_resources()["CPU"],
    "marker": ray.get(where.remote()),
}))
""",
    )
    facts = json.loads(out.strip().splitlines()[-1])
    assert facts == {"labels": ["cpu", "headgroup"], "team": ["", "search"], "cpus": 2.0, "marker": "hello"}


def test_scale_up_starts_a_node_and_scale_down_drains_it_without_killing_its_work(
    raypod_server: RaypodServer, api: Client, cluster: state.ClusterView
) -> None:
    api.clusters.scale("e2e", "cpu", 2)
    view = api.clusters.wait_ready("e2e", timeout=120)
    assert [n.name for n in view.status.nodes] == ["head", "cpu-0", "cpu-1"]
    target = node(view, "cpu-1").ray_node_id

    driver = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"""
import ray, time
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
ray.init()
@ray.remote(num_cpus=1)
def slow():
    print("started", flush=True)
    time.sleep(8)
    return "finished"
ref = slow.options(scheduling_strategy=NodeAffinitySchedulingStrategy("{target}", soft=False)).remote()
print(ray.get(ref), flush=True)
""",
        ],
        env=driver_env(raypod_server, view),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert driver.stdout is not None
        output = _Output(driver.stdout)
        output.wait_for("started")
        api.clusters.scale("e2e", "cpu", 1)
        output.wait_for("finished", timeout=90)
        assert driver.wait(timeout=30) == 0, output.seen
    finally:
        driver.kill()
        driver.wait()
        driver.stdout.close()
    view = api.clusters.wait_ready("e2e", timeout=90)
    assert [n.name for n in view.status.nodes] == ["head", "cpu-0"]
    assert "DrainedNode" in reasons(api)


class _Output:
    """A driver's output, read by one background thread, so the test can wait for a line without blocking."""

    def __init__(self, stream: IO[str]) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=lambda: [self.lines.put(line) for line in stream], daemon=True).start()

    def wait_for(self, text: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.seen):
            if time.monotonic() > deadline:
                raise AssertionError(f"driver never printed {text!r}: {self.seen}")
            try:
                self.seen.append(self.lines.get(timeout=0.5))
            except queue.Empty:
                continue


def test_a_killed_worker_is_detected_and_replaced(api: Client, cluster: state.ClusterView) -> None:
    before = api.clusters.get("e2e")
    old_pid = node(before, "cpu-0").pid
    raylets = [
        p
        for p in cluster_processes(before.uid)
        if p.name() == "raylet" and p.environ().get("RAYPOD_NODE_NAME") == "cpu-0"
    ]
    assert len(raylets) == 1
    seen_before = len(reasons(api))
    raylets[0].send_signal(signal.SIGKILL)
    wait_for_event(api, "ReplacedNode", count=reasons(api).count("ReplacedNode") + 1)
    view = api.clusters.wait_ready("e2e", timeout=120)
    assert node(view, "cpu-0").pid != old_pid
    assert {"NodeDied", "RemovedDeadNode", "ReplacedNode"} <= set(reasons(api)[seen_before:])


def test_kill_9_of_the_daemon_leaves_clusters_running_and_a_new_daemon_adopts_them(
    raypod_server: RaypodServer, api: Client, cluster: state.ClusterView
) -> None:
    schedule = every_minute(api)
    before = api.clusters.wait_ready("e2e", timeout=60)
    pids = {n.name: n.pid for n in before.status.nodes}
    processes_before = node_processes(before.uid)
    events_before = len(api.clusters.events("e2e", limit=1000))

    raypod_server.kill9()
    assert all(psutil.pid_exists(pid) for pid in pids.values() if pid)
    raypod_server.start()
    raypod_server.wait_for_passes(6)  # the new daemon looked at the cluster several times

    after = api.clusters.wait_ready("e2e", timeout=60)
    assert {n.name: n.pid for n in after.status.nodes} == pids
    new_events = [e.reason for e in api.clusters.events("e2e", limit=1000)[events_before:]]
    assert not any(r.startswith(("Created", "Replaced", "Deleted")) for r in new_events), new_events
    assert node_processes(before.uid) == processes_before

    # The schedule survived too: every minute it named since it was made has one run (the one missed while the
    # server was down, once), and no run was submitted to Ray twice.
    deadline = time.monotonic() + 90
    while not (runs := [j for j in api.jobs.list("e2e") if j.spec.metadata.get("raypod.schedule") == MINE]):
        assert time.monotonic() < deadline, "the schedule made no run"
        time.sleep(0.5)
    raypod_server.wait_for_passes(3)
    runs = [j for j in api.jobs.list("e2e") if j.spec.metadata.get("raypod.schedule") == MINE]
    view = api.schedules.get(EVERY_MINUTE)
    assert view.last_scheduled_at is not None
    minutes = int((view.last_scheduled_at - schedule.created_at).total_seconds() // 60) + 1
    assert len(runs) == minutes, [(j.id, j.created_at) for j in runs]
    assert all(len(j.attempts) <= 1 for j in runs), [(j.id, j.attempts) for j in runs]
    submissions = [a.submission_id for j in runs for a in j.attempts]
    assert len(submissions) == len(set(submissions)), submissions
    api.schedules.delete(EVERY_MINUTE)


def test_bad_input_is_refused_and_disturbs_nothing(
    raypod_server: RaypodServer, api: Client, cluster: state.ClusterView
) -> None:
    before = api.clusters.get("e2e")
    events_before = len(api.clusters.events("e2e", limit=1000))
    with pytest.raises(errors.AlreadyExists):
        api.clusters.create(SPEC)
    with pytest.raises(errors.InsufficientCapacity):
        api.clusters.create({"name": "huge", "worker_groups": [{"name": "cpu", "replicas": 200}]})
    with pytest.raises(errors.InsufficientCapacity):
        api.clusters.scale("e2e", "cpu", 500)
    with pytest.raises(errors.InvalidSpec):
        api.clusters.create({"name": "BAD"})
    with pytest.raises(errors.NotFound):
        api.clusters.scale("e2e", "gpu", 1)
    with pytest.raises(errors.InsufficientCapacity):
        api.clusters.create({"name": "gpus", "worker_groups": [{"name": "g", "gpus": 1}]})
    raypod_server.wait_for_passes(3)  # a refused request that had reached the loop would show by now
    after = api.clusters.get("e2e")
    assert not {"huge", "BAD", "gpus"} & {c.spec.name for c in api.clusters.list()}
    assert {n.name: n.pid for n in after.status.nodes} == {n.name: n.pid for n in before.status.nodes}
    assert len(api.clusters.events("e2e", limit=1000)) == events_before


def test_a_second_cluster_coexists_and_deleting_clusters_leaves_nothing_behind_but_history(
    raypod_server: RaypodServer, api: Client, cluster: state.ClusterView
) -> None:
    """...and the logs of its jobs, a finished one's and a running one's (as it was then), are read after the
    deletion, with ``raypod job list --all`` finding them (docs/history.md)."""
    api.clusters.create({"name": "other", "head": {"object_store_memory": "100Mi", "memory": "512Mi"}})
    other = api.clusters.wait_ready("other", timeout=180)
    done = api.jobs.submit("other", spec_mod.JobSpec(entrypoint="echo finished-job-line"))
    forever = "python -u -c \"print('running-job-line'); import time; time.sleep(600)\""
    running = api.jobs.submit("other", spec_mod.JobSpec(entrypoint=forever))
    assert api.jobs.wait(done.id, timeout=120).status is state.JobStatus.SUCCEEDED
    deadline = time.monotonic() + 120
    while "running-job-line" not in api.jobs.logs(running.id):
        assert time.monotonic() < deadline, "the running job never printed its first line"
        time.sleep(0.2)
    first = api.clusters.get("e2e")
    assert other.status.endpoints["gcs"] != first.status.endpoints["gcs"]
    assert other.status.endpoints["dashboard"] != first.status.endpoints["dashboard"]
    ports = [
        int(view.status.endpoints[key].rsplit(":", 1)[1]) for view in (first, other) for key in ("gcs", "dashboard")
    ]

    for view in (first, other):
        api.clusters.delete(view.spec.name)
    for view in (first, other):
        api.clusters.wait_deleted(view.spec.name, timeout=120)
        assert cluster_processes(view.uid) == []
        assert not (raypod_server.home / "local" / view.uid).exists()
    assert all(_ports.is_bindable(port) for port in ports)
    assert "Deleted" in reasons(api)
    assert not {"e2e", "other"} & {view.spec.name for view in api.clusters.list()}

    assert "finished-job-line" in run_cli(raypod_server, "raypod", "job", "logs", done.id).stdout
    assert "running-job-line" in run_cli(raypod_server, "raypod", "job", "logs", running.id).stdout
    listed = run_cli(raypod_server, "raypod", "job", "list", "--all").stdout
    for job in (done.id, running.id):
        line = next((li for li in listed.splitlines() if job in li), "")
        assert "default/other (deleted)" in line, listed
    assert "Archived" in [event.reason for event in api.clusters.events("other")]
    summary = run_cli(raypod_server, "raypod", "job", "summary", done.id, "-o", "json")
    assert summary.returncode == 0 and json.loads(summary.stdout)["note"] == "no Ray driver ran", summary.stderr


def test_up_and_down_run_the_daemon_with_a_default_cluster(tmp_path: Path) -> None:
    from raypod.testing import free_port

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAYPOD_", "RAY_"))}
    env.update({"RAYPOD_HOME": str(tmp_path), "RAYPOD_SERVER": f"https://127.0.0.1:{port}"})
    up = subprocess.run(
        [sys.executable, "-m", "raypod", "up", "--port", str(port), "--workers", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    try:
        assert up.returncode == 0, up.stderr[-2000:]
        assert "Ray dashboard" in up.stdout and "ray job submit --address raypod://local" in up.stdout
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("RAYPOD_HOME", str(tmp_path))
            with Client(env["RAYPOD_SERVER"]) as client:
                view = client.clusters.get("local")
        assert view.status.phase is state.ClusterPhase.READY
    finally:
        stopping = time.monotonic()
        down = subprocess.run(
            [sys.executable, "-m", "raypod", "down"], env=env, capture_output=True, text=True, timeout=240, check=False
        )
        took = time.monotonic() - stopping
    assert down.returncode == 0, down.stderr[-2000:]
    assert "server stopped" in down.stdout
    # The server stopped on its own, its loops shut down cleanly, not killed after daemon.stop's 30 s (an open
    # connection of down's own client held it: 36 s before).
    assert "Application shutdown complete" in (tmp_path / "server.log").read_text()
    assert took < 20, f"raypod down took {took:.0f} s"
    assert cluster_processes(view.uid) == []
