"""The local backend: the Backend protocol over the package's parts (records, processes, the launcher, the GCS
client, the Redis servers, the sidecars)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import ssl
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil

from raypod import errors, state
from raypod import spec as spec_mod
from raypod.backends import _ports, base, commands, ray_jobs
from raypod.backends.local import launch, processes, sidecars
from raypod.backends.local.gcs import Gcs, GcsTable
from raypod.backends.local.records import NODE_PORTS, ClusterRecord, NodeRecord, Records
from raypod.backends.local.redis import RedisServers

HEAD_OVERHEAD_BYTES = 1800 * 2**20
WORKER_OVERHEAD_BYTES = 350 * 2**20
STOP_GRACE_S = 3.0
MEMORY_SAMPLE_S = 15.0


class LocalBackend(base.NodesFollowActions):
    """Runs Ray nodes as local process trees; several clusters coexist without port clashes."""

    def __init__(
        self,
        home: Path,
        *,
        fast_health_checks: bool = True,
        isolation: str = "auto",
        env_passthrough: tuple[str, ...] = (),
    ) -> None:
        self.home = home
        self.records = Records(home / "local")
        self.root = self.records.root
        self._lock = threading.Lock()
        self._children = processes.Children()
        self._memory_samples: dict[str, tuple[float, dict[str, int | None]]] = {}
        self._http = httpx.Client(timeout=httpx.Timeout(30.0, connect=5.0))
        self._gpus = _count_gpus()
        self.features = frozenset(
            {
                base.Feature.DRAIN,
                base.Feature.GCS_FAULT_TOLERANCE,
                base.Feature.NODE_COMMANDS,
                base.Feature.SPACES,
                base.Feature.HANGWATCH,
                base.Feature.SHARED_ADDON_DIRS,
                base.Feature.KV_STORE,
                base.Feature.AUTOSCALING,
                base.Feature.RESOURCE_STATE,
            }
            | ({base.Feature.GPUS} if self._gpus else set())
        )
        self._gcs = Gcs(self.records.ray_token)
        self.sandbox, reason = launch.sandbox_available() if isolation == "auto" else (False, "RAYPOD_ISOLATION=off")
        self.launcher = launch.Launcher(
            home,
            self.records,
            sandbox=self.sandbox,
            fast_health_checks=fast_health_checks,
            env_passthrough=env_passthrough,
        )
        self._redis = RedisServers(self.records, self._children)
        self._sidecars = sidecars.Sidecars(self.records, self._children, self.launcher)
        self.tenancy = _tenancy(self.sandbox, reason)

    def capacity(self) -> base.HostCapacity:
        return base.HostCapacity(
            cpus_per_node=os.cpu_count() or 1,
            memory_bytes=psutil.virtual_memory().total,
            shared_memory_bytes=shutil.disk_usage("/dev/shm").total if Path("/dev/shm").exists() else None,
            gpus_per_node=self._gpus,
            head_overhead_bytes=HEAD_OVERHEAD_BYTES,
            worker_overhead_bytes=WORKER_OVERHEAD_BYTES,
        )

    # -- observation ---------------------------------------------------------------------------------------

    def set_change_listener(self, listener: Callable[[str], None]) -> None:
        """Not called: processes are polled, so the loop observes every cluster every pass (no CHANGE_EVENTS)."""

    def observe(self, cluster_id: str) -> state.ObservedCluster:
        self._children.reap()
        cluster = self.records.read_cluster(cluster_id)
        records = self.records.read_nodes(cluster_id)
        found = processes.by_node(cluster_id)
        if cluster is None:
            return state.ObservedCluster(stray_nodes=frozenset(found))
        self.records.expire_quarantine(cluster_id)
        head = next((r for r in records.values() if r.is_head), None)
        alive = head is not None and _is_alive(head)
        table = self._gcs.node_table(cluster_id, cluster.gcs_port) if alive else GcsTable({}, head_down=True)
        for record in records.values():
            ray_node = table.nodes.get(record.incarnation)
            if ray_node is not None and ray_node.alive and not record.registered:
                record.registered = True
                self.records.write_node(cluster_id, record)
        memory = self._memory_of(cluster_id, found)
        nodes = {name: _observe_node(record, table, cluster, memory.get(name)) for name, record in records.items()}
        serve_port = self.records.cluster_port(cluster_id, cluster, "serve_port")
        return state.ObservedCluster(
            nodes=nodes,
            endpoints={
                "dashboard": f"http://127.0.0.1:{cluster.dashboard_port}",
                "gcs": f"127.0.0.1:{cluster.gcs_port}",
                "client": f"ray://127.0.0.1:{cluster.client_port}",
                "serve": f"http://127.0.0.1:{serve_port}",
                **self._sidecars.endpoints(cluster_id, records),
            },
            stray_nodes=frozenset(name for name in found if name not in records and not name.startswith("_")),
            gcs_reachable=table.error is None,
            gcs_error=table.error or "",
        )

    def _memory_of(self, cluster_id: str, found: dict[str, list[psutil.Process]]) -> dict[str, int | None]:
        """Each node's memory, read at most every MEMORY_SAMPLE_S (reading it costs milliseconds per process)."""
        sampled = self._memory_samples.get(cluster_id)
        if sampled is not None and time.monotonic() - sampled[0] < MEMORY_SAMPLE_S:
            return sampled[1]
        memory = {name: processes.memory(node) for name, node in found.items()}
        self._memory_samples[cluster_id] = (time.monotonic(), memory)
        return memory

    # -- actions -------------------------------------------------------------------------------------------

    def create_node(self, cluster_id: str, node: spec_mod.NodeSpec) -> None:
        if node.gpus > self._gpus:
            raise errors.PermanentError(f"node {node.name} asks for {node.gpus} GPUs; this host has {self._gpus}")
        needed = HEAD_OVERHEAD_BYTES if node.is_head else WORKER_OVERHEAD_BYTES
        available = psutil.virtual_memory().available
        if available < needed:
            raise errors.TransientError(
                f"not enough free memory to start node {node.name}: {available // 2**20} MiB available on this "
                f"host, a {'head' if node.is_head else 'worker'} needs about {needed // 2**20} MiB"
            )
        with self._lock:
            cluster = self.records.ensure_cluster(cluster_id)
            os.makedirs(os.path.join(cluster.temp_dir, "shared"), exist_ok=True)
            existing = self.records.read_nodes(cluster_id).get(node.name)
            if existing and _is_alive(existing):
                return
            if node.managed_redis:
                cluster = self._redis.ensure_gcs_store(cluster_id, cluster)
            # Every port is pinned: left to Ray, nodes started at the same moment can pick the same free port.
            ports = self.records.allocate_ports(len(NODE_PORTS))
            record = NodeRecord(
                name=node.name,
                group=node.group,
                is_head=node.is_head,
                incarnation=uuid.uuid4().hex[:12],
                started_at=time.time(),
                **dict(zip(NODE_PORTS, ports, strict=True)),  # type: ignore[arg-type]
            )
            # Each worker has a session dir of its own, new with each incarnation: nodes that share one race
            # for socket and log names, and a replacement must not inherit what a failed node left behind.
            record.temp_dir = (
                cluster.temp_dir if node.is_head else os.path.join(cluster.temp_dir, f"n{record.incarnation[:8]}")
            )
            binds = self._sidecars.place(cluster, record, node.addons, set(ports))
            started = self.launcher.node(cluster_id, cluster, record, node, binds)
            try:
                # Not the server's working directory: a sandboxed node may not see it, and Python's spawned
                # subprocesses (the dashboard's modules) die at start when they cannot enter it.
                record.pid = self._children.spawn(
                    started, cwd=cluster.temp_dir, log_path=self.records.log_path(cluster_id, node.name)
                )
            except OSError as exc:
                raise errors.PermanentError(f"cannot start node {node.name}: {exc}") from exc
            record.create_time = processes.create_time(record.pid)
            self.records.write_node(cluster_id, record)

    def drain_node(self, cluster_id: str, name: str, ray_node_id: str, deadline: float, reason: str) -> None:
        cluster = self.records.read_cluster(cluster_id)
        record = self.records.read_nodes(cluster_id).get(name)
        if cluster is None or record is None:
            return
        self._gcs.drain(cluster_id, cluster.gcs_port, name, ray_node_id, deadline, reason)
        record.drain_deadline = deadline
        self.records.write_node(cluster_id, record)

    def resource_state(self, cluster_id: str) -> bytes | None:
        cluster = self.records.read_cluster(cluster_id)
        if cluster is None or not _ports.is_listening(cluster.gcs_port):
            return None
        return self._gcs.resource_state(cluster_id, cluster.gcs_port)

    def put_cluster_kv(self, cluster_id: str, namespace: bytes, key: bytes, value: bytes) -> None:
        cluster = self.records.read_cluster(cluster_id)
        if cluster is not None:
            self._gcs.put_kv(cluster_id, cluster.gcs_port, namespace, key, value)

    def delete_node(self, cluster_id: str, name: str, *, quarantine_s: float = 0.0) -> None:
        record = self.records.read_nodes(cluster_id).get(name)
        if record is not None and _is_alive(record):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(record.pid, signal.SIGTERM)
        # A node being replaced is dead or unhealthy (a drain already gave its work time): no grace period.
        grace = 0.0 if quarantine_s > 0 else STOP_GRACE_S
        processes.stop(lambda: processes.by_node(cluster_id).get(name, []), grace)
        self._children.reap()
        if record is not None and quarantine_s > 0:
            self.records.quarantine(cluster_id, record, quarantine_s)
        self.records.forget_node(cluster_id, name)

    def addon_dirs(self, cluster_id: str) -> dict[str, Path]:
        """Without a symbolic link on the way (the host's temporary root resolved), as the collector requires."""
        return {
            name: sidecars.resolved_parent(record.addon_dir)
            for name, record in self.records.read_nodes(cluster_id).items()
            if record.addon_dir
        }

    def start_sidecar(self, cluster_id: str, node: str, sidecar: str) -> None:
        with self._lock:
            cluster = self.records.read_cluster(cluster_id)
            record = self.records.read_nodes(cluster_id).get(node)
            if cluster is None or record is None or not _is_alive(record):
                raise errors.TransientError(f"node {node} is not running")
            self._sidecars.start(cluster_id, cluster, record, sidecar)

    def sidecar_token(self, cluster_id: str, node: str, sidecar: str) -> str:
        """A sidecar's own secret (0600 in the cluster's directory): the IDE's token, which the gateway presents."""
        return self.records.sidecar_token(cluster_id, node, sidecar)

    def run_on_node(self, cluster_id: str, name: str, command: str, timeout_s: float) -> commands.CommandResult:
        """Run ``command`` with the node's own environment and, when nodes are sandboxed, inside the node's
        namespaces without capabilities: a health check sees what the node sees and can do no more."""
        record = self.records.read_nodes(cluster_id).get(name)
        if record is None or not _is_alive(record):
            raise errors.NotFound(f"node {name} is not running")
        try:
            environment = self.launcher.running_environment(record)
        except (psutil.NoSuchProcess, psutil.AccessDenied) as exc:
            raise errors.NotFound(f"node {name} is not running") from exc
        started = self.launcher.as_node(record, environment, ["/bin/sh", "-c", command])
        try:
            return commands.run_command(
                started.argv, timeout_s=timeout_s, env=started.env, cwd="/", pass_fds=started.pass_fds
            )
        finally:
            started.close()

    def delete_bind(self, cluster_id: str, path: str) -> None:
        """The directory, and the folder that held it when that is left empty (a workspace's by-id folder)."""
        shutil.rmtree(path, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(path.rstrip("/")))

    def hidden_from_nodes(self, cluster_id: str, path: str) -> str | None:
        return self.launcher.hidden_from_nodes(cluster_id, path)

    def kv_store(self, cluster_id: str, max_bytes: int) -> str:
        return self._redis.kv_store(cluster_id, max_bytes)

    def release(self, cluster_id: str) -> None:
        processes.stop(lambda: [p for ps in processes.by_node(cluster_id).values() for p in ps], 0.0)
        cluster = self.records.read_cluster(cluster_id)
        self._gcs.forget(cluster_id)
        if cluster is not None:
            shutil.rmtree(cluster.temp_dir, ignore_errors=True)
        self.records.forget_cluster(cluster_id)

    def upstream_tls(self, cluster_id: str) -> ssl.SSLContext | None:
        return None  # every endpoint is plain HTTP on loopback

    def dashboard_headers(self, cluster_id: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.ray_token(cluster_id)}"}

    def ray_token(self, cluster_id: str) -> str:
        return self.records.ray_token(cluster_id)

    def job_api(self, cluster_id: str, dashboard_url: str) -> ray_jobs.RayJobApi:
        return ray_jobs.RayJobApi(dashboard_url, self.dashboard_headers(cluster_id), self._http)

    def close(self) -> None:
        self._gcs.close()
        self._children.reap()
        self._sidecars.close()
        self._http.close()


def _tenancy(sandbox: bool, reason: str) -> base.Tenancy:
    if sandbox:
        return base.Tenancy(
            isolated=True,
            summary=(
                "isolated: every node runs in its own mount and PID namespace without capabilities; a job "
                "sees its own cluster's processes and temporary files only, not $RAYPOD_HOME nor other "
                "clusters' files, and holds only its own cluster's Ray token"
            ),
        )
    return base.Tenancy(
        isolated=False,
        summary=(
            f"single-tenant ({reason}): every cluster's nodes and jobs run as this server's OS user "
            f"({_os_user()}) and see its files, $RAYPOD_HOME included. Each cluster has its own Ray token "
            "(a job cannot reach another cluster's dashboard or GCS) and no raypod secret is in a node's "
            "environment. For untrusted users, run as root (namespaces), one installation per tenant, "
            "or the Kubernetes backend (docs/security.md)."
        ),
    )


def _observe_node(
    record: NodeRecord, table: GcsTable, cluster: ClusterRecord, memory: int | None
) -> state.ObservedNode:
    ray_node = table.nodes.get(record.incarnation)
    ray_node_id = ray_node.node_id if ray_node else None
    if not _is_alive(record):
        phase, reason = state.NodePhase.DEAD, "node process exited"
    elif table.error is not None:
        phase, reason = state.NodePhase.UNKNOWN, "the GCS does not answer: the node's state in Ray is unknown"
    elif ray_node is None and table.head_down and record.registered and not record.is_head:
        # It had joined; with no GCS to ask, its state in Ray is unknown (with GCS fault tolerance it rejoins).
        phase, reason = state.NodePhase.UNKNOWN, "the head is down: waiting for its GCS to ask about this node"
    elif ray_node is None:
        phase, reason = state.NodePhase.STARTING, "waiting for the node to register with the GCS"
    elif not ray_node.alive:
        phase, reason = state.NodePhase.DEAD, "the GCS marked the node dead"
    elif record.drain_deadline is not None:
        phase, reason = state.NodePhase.DRAINING, "draining before removal"
    else:
        phase, reason = state.NodePhase.RUNNING, ""
    return state.ObservedNode(
        name=record.name,
        group=record.group,
        is_head=record.is_head,
        phase=phase,
        started_at=record.started_at,
        pid=record.pid,
        ray_node_id=ray_node_id,
        drain_deadline=record.drain_deadline,
        reason=reason,
        metrics_endpoint=ray_node.metrics_endpoint if ray_node and ray_node.alive else None,
        incarnation=record.incarnation,
        agent_endpoint=f"127.0.0.1:{record.agent_port}",
        session_dir=record.temp_dir or cluster.temp_dir,
        memory_bytes=memory,
        sidecars=sidecars.states(record) if _is_alive(record) else {},
    )


def _is_alive(record: NodeRecord) -> bool:
    return processes.process_matches(record.pid, record.create_time)


def _count_gpus() -> int:
    return len(list(Path("/proc/driver/nvidia/gpus").glob("*"))) if Path("/proc/driver/nvidia/gpus").exists() else 0


def _os_user() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())
