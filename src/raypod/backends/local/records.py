"""What the local backend started, as small JSON files under ``<home>/local/<cluster id>/``: a restarted control
plane reads them back (with the processes' markers) instead of remembering anything.

The files are raypod's own: nodes never see ``<home>`` when they are sandboxed. Secrets beside them (the cluster's
Ray token, its Redis password, each sidecar's token) are written 0600 from their first byte.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from raypod.backends import _ports

TOKEN_FILE = "ray-auth-token"
REDIS_PASSWORD_FILE = "redis-password"
QUARANTINE_FILE = "quarantine.json"
NODE_PORTS = (
    "agent_port",
    "metrics_port",
    "node_manager_port",
    "object_manager_port",
    "runtime_env_agent_port",
    "agent_grpc_port",
)
CLUSTER_PORTS = ("gcs_port", "dashboard_port", "client_port", "redis_port", "serve_port", "kv_redis_port")


@dataclass
class ClusterRecord:
    gcs_port: int
    dashboard_port: int
    client_port: int
    temp_dir: str
    redis_port: int = 0  # of the Redis raypod runs for GCS fault tolerance, once there is one
    serve_port: int = 0  # of the cluster's Ray Serve HTTP proxy (head only): each cluster has its own
    kv_redis_port: int = 0  # of the Redis raypod runs for the KV cache's shared tier, once there is one


@dataclass
class NodeRecord:
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


class Records:
    """The records of every cluster under ``root`` and the ports they hold."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)

    def cluster_dir(self, cluster_id: str) -> Path:
        return self.root / cluster_id

    def ensure_cluster(self, cluster_id: str) -> ClusterRecord:
        existing = self.read_cluster(cluster_id)
        if existing is not None:
            return existing
        gcs, dashboard, client, serve = self.allocate_ports(4)
        # Unix socket paths are limited to ~107 bytes: keep Ray's temp dir short, whatever RAYPOD_HOME is.
        temp_dir = os.path.join(tempfile.gettempdir(), f"rp-{cluster_id[:10]}")
        record = ClusterRecord(
            gcs_port=gcs, dashboard_port=dashboard, client_port=client, temp_dir=temp_dir, serve_port=serve
        )
        directory = self.cluster_dir(cluster_id)
        (directory / "nodes").mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            new_secret(directory / TOKEN_FILE)
        self.write_cluster(cluster_id, record)
        return record

    def read_cluster(self, cluster_id: str) -> ClusterRecord | None:
        data = read_json(self.cluster_dir(cluster_id) / "cluster.json")
        return ClusterRecord(**data) if data else None

    def write_cluster(self, cluster_id: str, record: ClusterRecord) -> None:
        write_json(self.cluster_dir(cluster_id) / "cluster.json", asdict(record))

    def cluster_port(self, cluster_id: str, cluster: ClusterRecord, name: str) -> int:
        """``cluster``'s port ``name``, allocated and recorded on first use (clusters made before a port existed
        get it on first sight)."""
        if not getattr(cluster, name):
            (port,) = self.allocate_ports(1)
            setattr(cluster, name, port)
            self.write_cluster(cluster_id, cluster)
        return int(getattr(cluster, name))

    def read_nodes(self, cluster_id: str) -> dict[str, NodeRecord]:
        found: dict[str, NodeRecord] = {}
        for path in sorted((self.cluster_dir(cluster_id) / "nodes").glob("*.json")):
            data = read_json(path)
            if data:
                record = NodeRecord(**data)
                found[record.name] = record
        return found

    def write_node(self, cluster_id: str, record: NodeRecord) -> None:
        write_json(self.cluster_dir(cluster_id) / "nodes" / f"{record.name}.json", asdict(record))

    def forget_node(self, cluster_id: str, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.cluster_dir(cluster_id) / "nodes" / f"{name}.json").unlink()

    def forget_cluster(self, cluster_id: str) -> None:
        shutil.rmtree(self.cluster_dir(cluster_id), ignore_errors=True)

    def log_path(self, cluster_id: str, name: str) -> Path:
        """A node's (or a sidecar's) log, in raypod's own directory: what a node writes is the node's to change."""
        return self.cluster_dir(cluster_id) / "nodes" / f"{name}.log"

    # -- secrets -------------------------------------------------------------------------------------------

    def ray_token(self, cluster_id: str) -> str:
        """The cluster's own Ray token (0600 beside its records); a new cluster, or a recreated one, gets a new
        one. Clusters made before per-cluster tokens keep the installation's old shared token."""
        try:
            return (self.cluster_dir(cluster_id) / TOKEN_FILE).read_text().strip()
        except FileNotFoundError:
            legacy = self.root / TOKEN_FILE
            if legacy.exists() and (self.cluster_dir(cluster_id) / "cluster.json").exists():
                return legacy.read_text().strip()
        return ""  # no such cluster (yet): nothing to authenticate to

    def redis_password(self, cluster_id: str) -> str:
        return self._secret(self.cluster_dir(cluster_id) / REDIS_PASSWORD_FILE)

    def sidecar_token(self, cluster_id: str, node: str, sidecar: str) -> str:
        return self._secret(self.cluster_dir(cluster_id) / "sidecars" / f"{node}.{sidecar}.token")

    @staticmethod
    def _secret(path: Path) -> str:
        """Read first: the gateway asks for a workspace's sidecar token on every request, and it exists after the
        first. A racing first use that loses the creation reads the winner's."""
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            pass
        try:
            return new_secret(path)
        except FileExistsError:
            return path.read_text().strip()

    # -- ports and the quarantine of replaced nodes' slots ------------------------------------------------

    def allocate_ports(self, count: int, taken: set[int] | None = None) -> list[int]:
        return _ports.allocate(count, self.reserved_ports() | (taken or set()))

    def reserved_ports(self) -> set[int]:
        reserved: set[int] = set()
        for directory in self.root.iterdir() if self.root.exists() else []:
            if not directory.is_dir():
                continue
            cluster = read_json(directory / "cluster.json")
            if cluster:
                reserved |= {cluster.get(key, 0) for key in CLUSTER_PORTS} - {0}
            quarantined = read_json(directory / QUARANTINE_FILE) or {"slots": []}
            reserved |= {port for slot in quarantined["slots"] for port in slot["ports"]}
            for path in (directory / "nodes").glob("*.json"):
                node = read_json(path)
                if node:
                    reserved |= {node[key] for key in NODE_PORTS if node.get(key)}
                    reserved |= set((node.get("sidecar_ports") or {}).values())
        return reserved

    def quarantine(self, cluster_id: str, record: NodeRecord, seconds: float) -> None:
        path = self.cluster_dir(cluster_id) / QUARANTINE_FILE
        entries = read_json(path) or {"slots": []}
        entries["slots"].append(
            {
                "node": record.name,
                "ports": [getattr(record, key) for key in NODE_PORTS],
                "temp_dir": record.temp_dir,
                "until": time.time() + seconds,
            }
        )
        write_json(path, entries)

    def expire_quarantine(self, cluster_id: str) -> None:
        """Free the slots whose cooling-off period passed; a worker's old session dir goes with it."""
        path = self.cluster_dir(cluster_id) / QUARANTINE_FILE
        entries = read_json(path)
        if not entries:
            return
        cluster = self.read_cluster(cluster_id)
        now = time.time()
        keep = [slot for slot in entries["slots"] if slot["until"] > now]
        if len(keep) == len(entries["slots"]):
            return
        for slot in entries["slots"]:
            own_dir = slot.get("temp_dir")
            if slot["until"] <= now and own_dir and cluster is not None and own_dir != cluster.temp_dir:
                shutil.rmtree(own_dir, ignore_errors=True)
        write_json(path, {"slots": keep})


def new_secret(path: Path) -> str:
    """A new random secret, written 0600 from its first byte. Raises FileExistsError when ``path`` exists."""
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(32)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(token)
    return token


def write_private(path: Path, text: str) -> None:
    """``text`` into ``path``, 0600 from its first byte (a file that holds a password)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)
