"""Chaos on real clusters (issue 13): nodes killed, frozen, cut off the network, failing their checks; a head
killed under GCS fault tolerance; a GCS that stops answering; the control plane killed in the middle of a
replacement. Every test asserts on events and final state (processes, Ray's own view, a training run's result),
waiting on them with deadlines, never on fixed sleeps.

Sized for a 2-core host: one server, a 0 + 2 node training cluster shared by most tests (the stopped-GCS test uses
it because it is old), and small clusters of their own for the health check and GCS fault tolerance tests, each
deleted when its test ends. A training run's undisturbed result is computed, not run.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis

from raypod import spec as spec_mod
from raypod import state
from raypod.backends import local
from raypod.client import Client
from tests.e2e.conftest import (
    RaypodServer,
    assert_same_weights,
    cluster_processes,
    module_server,
    undisturbed_training_weights,
    wait_until,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(900),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SIGSTOP/SIGKILL chaos needs Linux"),
]

SCRIPTS = Path(__file__).parent / "scripts"
SMALL = {"memory": "512Mi", "object_store_memory": "80Mi"}
TRAINING = {
    "name": "resilient",
    "head": {"cpus": 0, **SMALL},
    "worker_groups": [{"name": "cpu", "replicas": 2, "cpus": 1, "memory": "1Gi", "object_store_memory": "100Mi"}],
    "recovery": {"drain_timeout_s": 3, "max_replacements": 10},
}


# A node that has not started after NODE_START_TIMEOUT_S is replaced: the GCS test needs a cluster older than that,
# whose nodes a blind control plane would take for nodes that never started.
NODE_START_TIMEOUT_S = 60
DESTRUCTIVE = {"DeletedNode", "NodeStartTimedOut", "RemovedDeadNode", "ReplacedNode", "RestartedWithHead", "NodeDied"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RaypodServer]:
    env = {"RAYPOD_NODE_START_TIMEOUT_S": str(NODE_START_TIMEOUT_S), "RAYPOD_GCS_UNREACHABLE_TIMEOUT_S": "3"}
    with module_server(tmp_path_factory, "raypod-resilience", env) as started:
        yield started


@pytest.fixture(scope="module")
def training(server: RaypodServer) -> state.ClusterView:
    with server.client() as api:
        api.clusters.create(TRAINING)
        return api.clusters.wait_ready("resilient", timeout=240)


def events_since(api: Client, cluster: str, since: float, node: str | None = None) -> list[state.Event]:
    return [
        e
        for e in api.clusters.events(cluster, limit=1000)
        if e.time.timestamp() >= since and (node is None or e.node == node)
    ]


def reasons_since(api: Client, cluster: str, since: float, node: str | None = None) -> list[str]:
    return [e.reason for e in events_since(api, cluster, since, node)]


def node_processes(uid: str, node: str) -> list[psutil.Process]:
    found = []
    for process in cluster_processes(uid):
        try:
            if process.environ().get(local.NODE_MARKER) == node:
                found.append(process)
        except psutil.Error:
            continue
    return found


def kill_node(uid: str, node: str) -> float:
    """SIGKILL every process of a node at once, as when its machine dies; returns when it happened."""
    victims = node_processes(uid, node)
    assert victims, f"node {node} has no processes"
    killed_at = time.time()
    for process in victims:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    return killed_at


def raylets(uid: str) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for process in cluster_processes(uid):
        try:
            if process.name() == "raylet":
                found.setdefault(process.environ()[local.NODE_MARKER], []).append(process.pid)
        except (psutil.Error, KeyError):
            continue
    return found


def shared_dir(view: state.ClusterView) -> Path:
    """The cluster's shared directory as this host sees it (RAYPOD_SHARED_DIR inside the nodes)."""
    return Path(f"/tmp/rp-{view.uid[:10]}") / "shared"


def submit_training(api: Client, run: str, steps: int, step_s: float) -> state.JobView:
    script = (SCRIPTS / "resilient_train_script.py").read_bytes()
    uri = api.jobs.upload_working_dir("resilient", [("train/resilient_train_script.py", script)])
    return api.jobs.submit(
        "resilient",
        spec_mod.JobSpec(
            entrypoint=f"python resilient_train_script.py {run} {steps} {step_s}", runtime_env={"working_dir": uri}
        ),
    )


def result_of(api: Client, job: state.JobView) -> dict[str, Any]:
    finished = api.jobs.wait(job.id, timeout=400)
    logs = api.jobs.logs(job.id)
    assert finished.status is state.JobStatus.SUCCEEDED, logs[-3000:]
    line = next(line for line in reversed(logs.splitlines()) if line.startswith("RESULT "))
    result: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
    return result


def progress(view: state.ClusterView, run: str) -> list[dict[str, Any]]:
    try:
        text = (shared_dir(view) / run / "progress.jsonl").read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_a_training_run_survives_a_killed_worker_node_with_the_same_result(
    server: RaypodServer, training: state.ClusterView
) -> None:
    with server.client() as api:
        job = submit_training(api, "chaos", 8, 0.3)
        reached = wait_until(lambda: [p for p in progress(training, "chaos") if p["step"] >= 3], "step 3", 300)
        victim = reached[0]["node"]
        killed_at = kill_node(training.uid, victim)
        disturbed = result_of(api, job)
        assert_same_weights(disturbed["weights"], undisturbed_training_weights(8))
        assert disturbed["step"] == 7
        last = [p for p in progress(training, "chaos") if p["step"] == 7 and p["time"] > killed_at]
        assert len(last) == 2 and all(p["start"] >= 1 for p in last), "it resumed from a checkpoint, not from scratch"
        seen = reasons_since(api, "resilient", killed_at - 1, victim)
        for expected in ("NodeUnhealthy", "RemovedDeadNode", "ReplacedNode", "NodeStarted"):
            assert expected in seen, seen
        assert seen.index("NodeUnhealthy") < seen.index("ReplacedNode") < seen.index("NodeStarted")
        view = api.clusters.wait_ready("resilient", timeout=60)
        assert {n.health for n in view.status.nodes} == {state.NodeHealthState.HEALTHY}


def test_a_resubmitted_job_resumes_from_its_last_checkpoint(server: RaypodServer, training: state.ClusterView) -> None:
    """``raypod job submit --max-retries``: the driver dies mid-run, raypod resubmits, and the new attempt's Ray
    Train run (same name and storage) starts from the newest checkpoint of the first."""
    script = (SCRIPTS / "resilient_train_script.py").read_bytes()
    with server.client() as api:
        uri = api.jobs.upload_working_dir("resilient", [("train/resilient_train_script.py", script)])
        job = api.jobs.submit(
            "resilient",
            spec_mod.JobSpec(
                entrypoint="python resilient_train_script.py again 8 0.3",
                runtime_env={"working_dir": uri},
                max_retries=1,
                backoff_s=0,
            ),
        )
        wait_until(lambda: [p for p in progress(training, "again") if p["step"] >= 3], "step 3", 300)
        drivers = [
            p
            for p in node_processes(training.uid, "head")
            if "resilient_train_script.py again" in " ".join(p.cmdline())
        ]
        assert drivers, "the job's driver was not found on the head"
        killed_at = time.time()
        for driver in drivers:
            driver.kill()
        result = result_of(api, job)
        finished = api.jobs.get(job.id)
        assert [a.status for a in finished.attempts] == ["FAILED", "SUCCEEDED"]
        last = [p for p in progress(training, "again") if p["step"] == 7 and p["time"] > killed_at]
        assert len(last) == 2 and all(p["start"] >= 1 for p in last), "the resubmitted run started from scratch"
        assert result["step"] == 7


def test_a_frozen_raylet_is_detected_and_replaced(server: RaypodServer, training: state.ClusterView) -> None:
    with server.client() as api:
        api.clusters.wait_ready("resilient", timeout=120)
        raylet = psutil.Process(raylets(training.uid)["cpu-0"][0])
        frozen_at = time.time()
        raylet.send_signal(signal.SIGSTOP)
        try:
            wait_until(lambda: "NodeStarted" in reasons_since(api, "resilient", frozen_at, "cpu-0"), "a new cpu-0")
        finally:
            if raylet.is_running() and raylet.status() == psutil.STATUS_STOPPED:
                raylet.send_signal(signal.SIGCONT)
        unhealthy = next(e for e in events_since(api, "resilient", frozen_at, "cpu-0") if e.reason == "NodeUnhealthy")
        assert "cpu-0 is unhealthy" in unhealthy.message
        assert unhealthy.time.timestamp() - frozen_at < 10
        assert not raylet.is_running() or raylet.status() == psutil.STATUS_ZOMBIE, "the frozen node was not stopped"
        api.clusters.wait_ready("resilient", timeout=60)
        assert raylets(training.uid)["cpu-0"] != [raylet.pid]


def test_a_server_killed_during_a_replacement_finishes_it_after_restart(
    server: RaypodServer, training: state.ClusterView
) -> None:
    with server.client() as api:
        before = api.clusters.wait_ready("resilient", timeout=120)
        old_pid = next(n.pid for n in before.status.nodes if n.name == "cpu-1")
        asked_at = time.time()
        api.clusters.replace_node("resilient", "cpu-1")
        wait_until(lambda: "DrainingOnRequest" in reasons_since(api, "resilient", asked_at, "cpu-1"), "the drain")
    server.kill9()  # mid-replacement: cpu-1 is draining, its replacement not started
    server.start()
    with server.client() as api:
        wait_until(lambda: "NodeStarted" in reasons_since(api, "resilient", asked_at, "cpu-1"), "a new cpu-1")
        view = api.clusters.wait_ready("resilient", timeout=120)
        seen = reasons_since(api, "resilient", asked_at, "cpu-1")
        assert seen.count("RemovedOnRequest") == 1 and seen.count("ReplacedNode") == 1, seen
        assert next(n.pid for n in view.status.nodes if n.name == "cpu-1") != old_pid
    assert {name: len(pids) for name, pids in raylets(training.uid).items()} == {"head": 1, "cpu-0": 1, "cpu-1": 1}
    assert not psutil.pid_exists(old_pid) or psutil.Process(old_pid).status() == psutil.STATUS_ZOMBIE
    nodes = {p.environ().get(local.NODE_MARKER) for p in cluster_processes(training.uid)}
    assert nodes == {"head", "cpu-0", "cpu-1"}, "an orphaned process of an old node is left"


def test_a_stopped_gcs_deletes_and_restarts_nothing(server: RaypodServer, training: state.ClusterView) -> None:
    """A GCS that stops answering must not look like nodes that never started (issue 11): the training cluster's
    ``gcs_server`` is SIGSTOPped past raypod's GCS-unreachable bound, then SIGCONTed; no node is deleted or
    restarted, and the outage is an event and a condition, not a silent mass delete."""
    with server.client() as api:
        ready = api.clusters.wait_ready("resilient", timeout=120)
        pids = {node.name: node.pid for node in ready.status.nodes}
        old_enough = ready.created_at.timestamp() + NODE_START_TIMEOUT_S + 2
        wait_until(lambda: time.time() > old_enough, "the cluster to be older than the node start timeout", 90)
        [gcs] = [p for p in cluster_processes(training.uid) if p.name() == "gcs_server"]
        stopped_at = time.time()
        gcs.send_signal(signal.SIGSTOP)
        try:
            wait_until(lambda: api.clusters.get("resilient").status.phase is state.ClusterPhase.UNKNOWN, "Unknown")
            # Longer than the GCS call timeout several times over, and than the GCS-unreachable bound.
            wait_until(
                lambda: "GCSUnreachableTooLong" in reasons_since(api, "resilient", stopped_at),
                "the unreachable-too-long event",
            )
            blind = api.clusters.get("resilient")
            assert {n.phase for n in blind.status.nodes} == {state.NodePhase.UNKNOWN}
            condition = blind.status.condition("GCSReachable")
            assert condition is not None and not condition.status
            assert condition.reason == "GCSUnreachableTooLong"
        finally:
            gcs.send_signal(signal.SIGCONT)

        # Ready again within seconds of the GCS answering: nothing held the loop meanwhile (a GCS client made while
        # the GCS did not answer held it for over 30 s).
        after = api.clusters.wait_ready("resilient", timeout=20)
        assert {node.name: node.pid for node in after.status.nodes} == pids, "a node was restarted"
        reasons = reasons_since(api, "resilient", stopped_at)
        assert not DESTRUCTIVE & set(reasons), reasons
        assert reasons.count("GCSUnreachable") == 1 and reasons.count("GCSReachable") == 1, reasons


def test_a_failing_health_check_replaces_the_node_and_one_that_always_fails_hits_the_flapping_guard(
    server: RaypodServer,
) -> None:
    spec = {
        "name": "checked",
        "head": {"cpus": 0, **SMALL},
        "worker_groups": [{"name": "cpu", "replicas": 1, "cpus": 1, **SMALL}],
        "health_checks": [
            {
                "name": "marker",
                # Each run leaves its time: the witness that the check kept failing while nothing was replaced.
                "command": 'date +%s.%N >> "$RAYPOD_SHARED_DIR/checked-$RAYPOD_NODE_NAME";'
                ' test ! -e "$RAYPOD_SHARED_DIR/broken-$RAYPOD_NODE_NAME"',
                "period_s": 1,
                "timeout_s": 1,
                "failure_threshold": 2,
            }
        ],
        "recovery": {"drain_timeout_s": 2, "max_replacements": 2, "window_s": 600},
    }
    with server.client() as api:
        api.clusters.create(spec)
        view = api.clusters.wait_ready("checked", timeout=240)
        broken_at = time.time()
        (shared_dir(view) / "broken-cpu-0").touch()  # every incarnation of cpu-0 now fails the check
        wait_until(
            lambda: "ReplacementLimitReached" in reasons_since(api, "checked", broken_at), "the flapping guard", 240
        )
        seen = reasons_since(api, "checked", broken_at, "cpu-0")
        assert seen.count("RemovedUnhealthyNode") == 2 and seen.count("DrainingUnhealthyNode") == 2, seen
        unhealthy = next(e for e in events_since(api, "checked", broken_at, "cpu-0") if e.reason == "NodeUnhealthy")
        assert "check:marker: exit 1" in unhealthy.message

        def held_unhealthy() -> state.ClusterView | None:
            view = api.clusters.get("checked")
            cpu0 = next(n for n in view.status.nodes if n.name == "cpu-0")
            healthless = cpu0.health is state.NodeHealthState.UNHEALTHY and cpu0.phase is state.NodePhase.RUNNING
            return view if healthless else None

        # The third incarnation fails its check too, and is left running, unhealthy, as it is.
        held = wait_until(held_unhealthy, "the third cpu-0 to be unhealthy", 60)
        assert held.status.phase is state.ClusterPhase.DEGRADED and "reached 2 replacement(s)" in held.status.message
        # Held, the node is left as it is: no third replacement however long it fails. The window is counted in
        # the check's own failed runs: 6 of them are three times the threshold, and a drain (2 s) fits between.
        held_at = time.time()
        checked = shared_dir(view) / "checked-cpu-0"

        def failed_runs_since_held() -> int:
            return sum(1 for line in checked.read_text().split() if float(line) > held_at)

        wait_until(lambda: failed_runs_since_held() >= 6, "six more failed checks of the held node", 60)
        seen = reasons_since(api, "checked", broken_at, "cpu-0")
        assert seen.count("DrainingUnhealthyNode") == 2 and seen.count("RemovedUnhealthyNode") == 2, seen
        assert next(n for n in api.clusters.get("checked").status.nodes if n.name == "cpu-0").phase is (
            state.NodePhase.RUNNING
        )
        api.clusters.delete("checked")
        api.clusters.wait_deleted("checked", timeout=120)


def test_a_killed_head_with_gcs_fault_tolerance_comes_back_and_workers_keep_running(server: RaypodServer) -> None:
    spec = {
        "name": "ft",
        "head": {"cpus": 0, **SMALL},
        "worker_groups": [{"name": "cpu", "replicas": 1, "cpus": 1, **SMALL}],
        "gcs_fault_tolerance": {},
    }
    with server.client() as api:
        api.clusters.create(spec)
        view = api.clusters.wait_ready("ft", timeout=240)
        home = server.home / "local" / view.uid
        redis_port = json.loads((home / "cluster.json").read_text())["redis_port"]
        # Asked by a client with no password (the redis package, not Debian's redis-cli: nothing from apt needed).
        with pytest.raises(redis.exceptions.AuthenticationError):
            redis.Redis(port=redis_port, socket_timeout=10).ping()
        assert (home / "redis-password").stat().st_mode & 0o077 == 0
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("RAY_")},
            "RAY_ADDRESS": view.status.endpoints["gcs"],
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": server.ray_token(view.uid),
        }
        counter = SCRIPTS / "counter_script.py"
        first = subprocess.run(
            [sys.executable, str(counter), "create"], env=env, capture_output=True, text=True, timeout=120
        )
        assert first.returncode == 0, first.stderr[-2000:]
        actor_pid = re.search(r"COUNT 1 PID (\d+)", first.stdout)
        assert actor_pid, first.stdout
        worker_pid = next(n.pid for n in view.status.nodes if n.name == "cpu-0")
        worker_id = next(n.ray_node_id for n in view.status.nodes if n.name == "cpu-0")
        killed_at = kill_node(view.uid, "head")
        wait_until(lambda: "NodeStarted" in reasons_since(api, "ft", killed_at, "head"), "the head back", 180)
        after = api.clusters.wait_ready("ft", timeout=120)
        worker = next(n for n in after.status.nodes if n.name == "cpu-0")
        assert (worker.pid, worker.ray_node_id) == (worker_pid, worker_id), "the worker restarted"
        assert "RestartedWithHead" not in reasons_since(api, "ft", killed_at)
        second = subprocess.run(
            [sys.executable, str(counter), "get"], env=env, capture_output=True, text=True, timeout=180
        )
        assert second.returncode == 0, second.stderr[-2000:]
        assert f"COUNT 2 PID {actor_pid.group(1)}" in second.stdout, "the actor lost its state or restarted"
        api.clusters.delete("ft")
        api.clusters.wait_deleted("ft", timeout=120)
    assert not [
        p
        for p in psutil.process_iter(["name"])
        if p.info["name"] in ("redis-server", "valkey-server") and _port_of(p) == redis_port
    ]


def _port_of(process: psutil.Process) -> int | None:
    try:
        return next((c.laddr.port for c in process.net_connections() if c.status == psutil.CONN_LISTEN), None)
    except psutil.Error:
        return None


@pytest.mark.skipif(
    shutil.which("iptables") is None or os.geteuid() != 0, reason="cutting a node off needs iptables and root"
)
def test_a_node_cut_off_from_the_network_is_detected_and_replaced_on_fresh_ports(
    server: RaypodServer, training: state.ClusterView
) -> None:
    """Every port the node listens on drops what comes in on loopback (the only network here), so neither its
    GCS nor raypod can reach it although all its processes run. A network namespace cannot be used for this on
    one host: the node's GCS address is the host's loopback, which a namespace of its own would not have."""
    record = json.loads((server.home / "local" / training.uid / "nodes" / "cpu-1.json").read_text())
    ports = [record[key] for key in local.NODE_PORTS]
    rules = [["INPUT", "-i", "lo", "-p", "tcp", "--dport", str(port), "-j", "DROP"] for port in ports]
    with server.client() as api:
        api.clusters.wait_ready("resilient", timeout=120)
        cut_at = time.time()
        for rule in rules:
            subprocess.run(["iptables", "-I", *rule], check=True)
        try:
            wait_until(lambda: "NodeStarted" in reasons_since(api, "resilient", cut_at, "cpu-1"), "a new cpu-1", 180)
        finally:
            for rule in rules:
                subprocess.run(["iptables", "-D", *rule], check=False)
        unhealthy = next(e for e in events_since(api, "resilient", cut_at, "cpu-1") if e.reason == "NodeUnhealthy")
        assert unhealthy.time.timestamp() - cut_at < 15
        api.clusters.wait_ready("resilient", timeout=60)
    fresh = json.loads((server.home / "local" / training.uid / "nodes" / "cpu-1.json").read_text())
    assert not set(ports) & {fresh[key] for key in local.NODE_PORTS}, "the replacement reused quarantined ports"
