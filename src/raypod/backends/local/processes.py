"""The processes of local nodes: started detached, found again by the markers they inherit, stopped by group.

Every process of a node (and the Redis servers of a cluster) carries two environment markers, the cluster's id and
the node's name; children inherit them, so a restarted control plane finds every process a node started without a
record of their pids.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import psutil

from raypod.backends import privileged

CLUSTER_MARKER = "RAYPOD_CLUSTER_ID"
NODE_MARKER = "RAYPOD_NODE_NAME"


class Children:
    """The processes this backend started, kept until they exit so that none is left a zombie."""

    def __init__(self) -> None:
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    def spawn(self, launch: privileged.Launch, *, cwd: str | None, log_path: Path) -> int:
        """Start ``launch`` detached (a session of its own, output appended to ``log_path``); its pid. The launch's
        descriptors are closed once the child has them.

        Raises:
            OSError: it could not start.
        """
        try:
            with open(log_path, "ab") as output:
                child = subprocess.Popen(
                    launch.argv,
                    env=launch.env,
                    cwd=cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                    pass_fds=launch.pass_fds,
                )
        finally:
            launch.close()
        self._children[child.pid] = child
        return child.pid

    def exited(self, pid: int) -> bool:
        child = self._children.get(pid)
        return child is not None and child.poll() is not None

    def reap(self) -> None:
        for pid, child in list(self._children.items()):
            if child.poll() is not None:
                del self._children[pid]


def markers(environment: Mapping[str, str]) -> dict[str, str]:
    """The variables by which raypod finds a node's processes (its own names, not secrets)."""
    return {name: environment[name] for name in (CLUSTER_MARKER, NODE_MARKER) if name in environment}


def process_matches(pid: int, create_time: float) -> bool:
    """Whether ``pid`` is still the live process that started at ``create_time`` (not a reused pid)."""
    try:
        process = psutil.Process(pid)
        return abs(process.create_time() - create_time) < 1.0 and process.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return False


def create_time(pid: int) -> float:
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.NoSuchProcess:
        return 0.0


def memory(processes: list[psutil.Process]) -> int | None:
    """Proportional set size of a node's processes: shared pages (libraries, the object store) are split among
    the processes that map them, so nodes are not charged several times for them, as a sum of RSS would."""
    total = 0
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, AttributeError):
            total += process.memory_full_info().pss
    return total or None


_MARKERS: dict[tuple[int, float], tuple[str, str] | None] = {}  # (pid, start time) -> (cluster, node)
_MARKERS_LOCK = threading.Lock()


def by_node(cluster_id: str) -> dict[str, list[psutil.Process]]:
    """Every live process that carries this cluster's marker, by node name (children inherit the marker).

    A process's environment is read once: it is cached by pid and start time, which together name one process
    for good. Reading every environment on every pass cost the control plane a good part of a core."""
    found: dict[str, list[psutil.Process]] = {}
    alive: set[tuple[int, float]] = set()
    for process in psutil.process_iter():
        try:
            key = (process.pid, process.create_time())
            alive.add(key)
            with _MARKERS_LOCK:
                known = key in _MARKERS
                marker = _MARKERS.get(key)
            if not known:
                environment = process.environ()
                cluster = environment.get(CLUSTER_MARKER)
                marker = (cluster, environment.get(NODE_MARKER, "?")) if cluster else None
                with _MARKERS_LOCK:
                    _MARKERS[key] = marker
            if marker is None or marker[0] != cluster_id or process.status() == psutil.STATUS_ZOMBIE:
                continue
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
        found.setdefault(marker[1], []).append(process)
    with _MARKERS_LOCK:
        for gone in [key for key in _MARKERS if key not in alive]:
            del _MARKERS[gone]
    return found


def stop(list_processes: Callable[[], list[psutil.Process]], grace_s: float) -> None:
    """Wait up to ``grace_s`` for processes to exit after SIGTERM, then SIGKILL what is left."""
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and list_processes():
        time.sleep(0.1)
    for _ in range(3):
        remaining = list_processes()
        if not remaining:
            return
        for process in remaining:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                process.kill()
        psutil.wait_procs(remaining, timeout=2)
