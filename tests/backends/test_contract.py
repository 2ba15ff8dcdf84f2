"""One contract for every backend: what ``observe``, ``create_node``, ``drain_node``, ``delete_node`` and
``release`` mean, run against the in-memory backend and against the local backend with real Ray nodes.

The local run is marked e2e (it starts a real head and worker). Its unreachable GCS is a real one: the cluster's
``gcs_server`` is SIGSTOPped, so the GCS port still accepts connections and calls time out.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psutil
import pytest

from raypod import addons, state
from raypod import spec as spec_mod
from raypod.backends import base, fake, local

Phase = state.NodePhase
SPEC = spec_mod.parse_spec(
    {
        "name": "contract",
        "head": {"cpus": 1, "memory": "512Mi", "object_store_memory": "80Mi"},
        "worker_groups": [{"name": "cpu", "replicas": 1, "cpus": 1, "memory": "512Mi", "object_store_memory": "80Mi"}],
    }
)
# Add-ons in the backend's own words (no capability): a file, a variable and a sidecar that reads the file.
WATCHER = addons.Sidecar(
    "watcher", ("/bin/sh", "-c", 'cat "{addon_dir}/greeting" > "{addon_dir}/seen"; exec sleep 600')
)
ADDONS = addons.NodeAddons(
    env=(("CONTRACT_ADDON_DIR", "{addon_dir}"),), files=(("greeting", b"hello"),), sidecars=(WATCHER,)
)
HEAD, WORKER = (replace(node, addons=ADDONS) for node in SPEC.desired_nodes())


@dataclass
class Harness:
    backend: base.Backend
    cluster_id: str
    gcs_unreachable: Callable[[], contextlib.AbstractContextManager[None]]
    timeout_s: float


@contextlib.contextmanager
def _fake_harness() -> Iterator[Harness]:
    backend = fake.FakeBackend()

    @contextlib.contextmanager
    def unreachable() -> Iterator[None]:
        backend.set_gcs_reachable("c-fake", False)
        try:
            yield
        finally:
            backend.set_gcs_reachable("c-fake", True)

    yield Harness(backend, "c-fake", unreachable, timeout_s=1)


@contextlib.contextmanager
def _local_harness(home: Path) -> Iterator[Harness]:
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    backend = local.LocalBackend(home)
    cluster_id = "contract0local"

    @contextlib.contextmanager
    def unreachable() -> Iterator[None]:
        gcs = [p for p in _cluster_processes(cluster_id) if p.name() == "gcs_server"]
        assert len(gcs) == 1, f"expected one gcs_server, found {gcs}"
        gcs[0].send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            gcs[0].send_signal(signal.SIGCONT)

    try:
        yield Harness(backend, cluster_id, unreachable, timeout_s=90)
    finally:
        backend.release(cluster_id)
        backend.close()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        from ray._raylet import AuthenticationTokenLoader  # type: ignore[attr-defined]

        AuthenticationTokenLoader.instance().reset_cache()  # later Ray users in this process read their own token


@contextlib.contextmanager
def spawned_processes() -> Iterator[list[list[str]]]:
    """The argv of every process started in this process meanwhile (a spy on subprocess.Popen)."""
    spawned: list[list[str]] = []
    real = subprocess.Popen

    class Spy(real):  # type: ignore[misc,valid-type]
        def __init__(self, args: Any, *rest: Any, **options: Any) -> None:
            spawned.append(list(args) if isinstance(args, list | tuple) else [str(args)])
            super().__init__(args, *rest, **options)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subprocess, "Popen", Spy)
        yield spawned


def _cluster_processes(cluster_id: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if process.environ().get(local.CLUSTER_MARKER) == cluster_id:
                found.append(process)
    return found


@pytest.fixture(params=["fake", pytest.param("local", marks=[pytest.mark.e2e, pytest.mark.timeout(300)])])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    maker = _fake_harness() if request.param == "fake" else _local_harness(tmp_path)
    with maker as made:
        yield made


def wait_for(harness: Harness, predicate: Callable[[state.ObservedCluster], bool], what: str) -> state.ObservedCluster:
    deadline = time.monotonic() + harness.timeout_s
    while True:
        seen = harness.backend.observe(harness.cluster_id)
        if predicate(seen):
            return seen
        assert time.monotonic() < deadline, f"not {what} within {harness.timeout_s} s: {seen}"
        time.sleep(0.2)


def phase(name: str, *phases: Phase) -> Callable[[state.ObservedCluster], bool]:
    return lambda seen: name in seen.nodes and seen.nodes[name].phase in phases


def test_an_unknown_cluster_is_observed_empty(harness: Harness) -> None:
    seen = harness.backend.observe("never-created")
    assert seen.nodes == {} and seen.stray_nodes == frozenset() and seen.gcs_reachable


def test_node_lifecycle(harness: Harness) -> None:
    backend, cid = harness.backend, harness.cluster_id
    backend.create_node(cid, HEAD)
    head = wait_for(harness, phase("head", Phase.RUNNING), "head running").nodes["head"]
    assert head.is_head and head.ray_node_id
    backend.create_node(cid, HEAD)  # idempotent: the running head is kept
    again = backend.observe(cid).nodes["head"]
    assert (again.pid, again.ray_node_id) == (head.pid, head.ray_node_id)

    backend.create_node(cid, WORKER)
    seen = wait_for(harness, phase(WORKER.name, Phase.RUNNING), "worker running")
    assert seen.gcs_reachable and seen.nodes[WORKER.name].group == "cpu"

    # observe only reads: a sidecar the node should run is reported as not started, however often it looks, and
    # runs once the loop's action asks for it.
    with spawned_processes() as spawned:
        for _ in range(3):
            seen = backend.observe(cid)
    assert spawned == [], f"observe started processes: {spawned}"
    assert seen.nodes[WORKER.name].sidecars == {"watcher": state.SidecarState.NOT_STARTED}
    backend.start_sidecar(cid, WORKER.name, "watcher")
    running = wait_for(harness, lambda s: s.nodes[WORKER.name].sidecars.get("watcher") is state.SidecarState.RUNNING,
                       "the sidecar running")  # fmt: skip
    assert running.nodes["head"].sidecars == {"watcher": state.SidecarState.NOT_STARTED}
    if isinstance(backend, local.LocalBackend):
        # The sidecar ran in the node's world: its add-on directory filled in, the file written before the start.
        seen_file = backend.addon_dirs(cid)[WORKER.name] / "seen"
        wait_for(harness, lambda _: seen_file.exists() and seen_file.read_text() == "hello", "the sidecar's output")
        ran = backend.run_on_node(cid, WORKER.name, 'cat "$CONTRACT_ADDON_DIR/greeting"', 10)
        assert ran.output.strip() == "hello", ran.output

    with harness.gcs_unreachable():
        blind = wait_for(harness, lambda s: not s.gcs_reachable, "GCS reported unreachable")
        assert {n.phase for n in blind.nodes.values()} == {Phase.UNKNOWN}
        assert blind.gcs_error
    wait_for(harness, lambda s: s.gcs_reachable and s.nodes[WORKER.name].phase is Phase.RUNNING, "GCS back")
    assert backend.observe(cid).nodes["head"].pid == head.pid, "the head was restarted"

    # A command runs where the node runs, bounded by its timeout, with the node's name in its environment.
    ran = backend.run_on_node(cid, WORKER.name, 'echo "on $RAYPOD_NODE_NAME"; exit 3', 10)
    assert (ran.exit_code, ran.output.strip()) == (3, f"on {WORKER.name}")
    assert backend.run_on_node(cid, WORKER.name, "sleep 30", 0.5).exit_code is None
    if isinstance(backend, local.LocalBackend) and backend.sandbox:
        # A user's health check runs as the node does: raypod's home is not visible, and no capability is held.
        (backend.home / "credentials").write_text("secret")
        peek = backend.run_on_node(
            cid, WORKER.name, f"cat {backend.home}/credentials; grep CapEff /proc/self/status", 10
        )
        assert "secret" not in peek.output and "0000000000000000" in peek.output, peek.output

    # A replacement is a new incarnation, and a quarantined slot (the local backend's ports) is not reused.
    first = backend.observe(cid).nodes[WORKER.name]
    assert first.incarnation
    backend.delete_node(cid, WORKER.name, quarantine_s=60)
    backend.create_node(cid, WORKER)
    second = wait_for(harness, phase(WORKER.name, Phase.RUNNING), "replacement running").nodes[WORKER.name]
    assert second.incarnation != first.incarnation
    assert second.agent_endpoint != first.agent_endpoint or first.agent_endpoint is None

    running = backend.observe(cid).nodes[WORKER.name]
    assert running.ray_node_id
    backend.drain_node(cid, WORKER.name, running.ray_node_id, time.time() + 30, "contract test")
    wait_for(harness, phase(WORKER.name, Phase.DRAINING, Phase.DEAD), "worker draining")
    backend.delete_node(cid, WORKER.name)
    assert WORKER.name not in backend.observe(cid).nodes

    backend.release(cid)
    assert backend.observe(cid).nodes == {}
