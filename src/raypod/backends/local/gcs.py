"""The local backend's client of each cluster's GCS: the node table, drains and the cluster's key-value store.

Each cluster has its own Ray token. Ray's clients in this process read the token of the cluster they talk to from
the environment at call time (after a cache reset), so every GCS call holds one lock.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from raypod import errors
from raypod.backends import _ports

log = logging.getLogger(__name__)

GCS_TIMEOUT_S = 2.0
DEADLINE_EXCEEDED = 4  # the gRPC status code of a call that got no answer in time (RpcError.rpc_code)
INCARNATION_LABEL = "raypod.io/incarnation"


@dataclass(frozen=True)
class RayNode:
    node_id: str
    alive: bool
    metrics_endpoint: str


@dataclass(frozen=True)
class GcsTable:
    """The GCS node table by incarnation, or the error that kept raypod from reading it."""

    nodes: dict[str, RayNode]
    error: str | None = None
    head_down: bool = False  # no GCS to ask: the head is starting, restarting or gone


def ray_auth_environment(token: str) -> dict[str, str]:
    """Ray's token authentication: every Ray port (dashboard, GCS and raylet gRPC) rejects requests without it."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}


class Gcs:
    """One cached GCS client per cluster, each call made with that cluster's token."""

    def __init__(self, ray_token: Callable[[str], str]) -> None:
        self._ray_token = ray_token
        self._clients: dict[str, tuple[int, Any]] = {}
        self._errors: dict[str, str] = {}
        self._token_lock = threading.RLock()
        os.environ["RAY_AUTH_MODE"] = "token"  # read once, when Ray's core library loads
        require_token_mode()

    def node_table(self, cluster_id: str, port: int) -> GcsTable:
        """What the GCS node table says of each incarnation.

        A GCS that is not listening yet has an empty table (its nodes are starting); one that listens but does
        not answer is an error, so that live nodes are reported as unknown rather than as not started.
        """
        if not _ports.is_listening(port):
            self._note(cluster_id, None)
            return GcsTable({}, head_down=True)
        try:
            table = self._call(cluster_id, port, lambda client: client.get_all_node_info(timeout=GCS_TIMEOUT_S))
        except Exception as exc:
            error = f"the GCS at 127.0.0.1:{port} did not answer ({type(exc).__name__}: {exc})"[:300]
            self._note(cluster_id, error)
            return GcsTable({}, error)
        self._note(cluster_id, None)
        found: dict[str, RayNode] = {}
        for node_id, info in table.items():
            incarnation = dict(info.labels).get(INCARNATION_LABEL)
            if incarnation:
                found[incarnation] = RayNode(
                    node_id=node_id.hex(),
                    alive=info.state == 0,
                    metrics_endpoint=f"{info.node_manager_address}:{info.metrics_export_port}",
                )
        return GcsTable(found)

    def drain(self, cluster_id: str, port: int, node: str, ray_node_id: str, deadline: float, reason: str) -> None:
        """Ask Ray to drain a node as a preemption (Ray Train and Serve move their work off it).

        Raises:
            TransientError: the GCS did not answer, or refused.
        """
        from ray.core.generated import autoscaler_pb2

        preemption = autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION")  # type: ignore[attr-defined]
        try:
            accepted, rejection = self._call(
                cluster_id,
                port,
                lambda client: client.drain_node(
                    ray_node_id, preemption, reason, int(deadline * 1000), timeout=GCS_TIMEOUT_S
                ),
            )
        except Exception as exc:
            raise errors.TransientError(f"cannot drain node {node}: {exc}") from exc
        if not accepted:
            raise errors.TransientError(f"Ray refused to drain node {node}: {rejection}")

    def resource_state(self, cluster_id: str, port: int) -> bytes:
        """The cluster's ``ClusterResourceState`` (Ray's autoscaler's input), serialized.

        Raises:
            TransientError: the GCS did not answer.
        """
        from ray.core.generated import autoscaler_pb2

        try:
            raw = self._call(
                cluster_id, port, lambda client: client.get_cluster_resource_state(timeout_s=GCS_TIMEOUT_S)
            )
        except Exception as exc:
            raise errors.TransientError(f"cannot read the cluster's resource demand: {exc}") from exc
        reply = autoscaler_pb2.GetClusterResourceStateReply()  # type: ignore[attr-defined]
        reply.ParseFromString(raw)
        return bytes(reply.cluster_resource_state.SerializeToString())

    def put_kv(self, cluster_id: str, port: int, namespace: bytes, key: bytes, value: bytes) -> None:
        try:
            self._call(
                cluster_id,
                port,
                lambda client: client.internal_kv_put(key, value, True, namespace, timeout=GCS_TIMEOUT_S),
            )
        except Exception as exc:
            raise errors.TransientError(f"cannot write to the cluster's Ray key-value store: {exc}") from exc

    def forget(self, cluster_id: str) -> None:
        self._clients.pop(cluster_id, None)

    def close(self) -> None:
        self._clients.clear()

    def _call(self, cluster_id: str, port: int, call: Callable[[Any], Any]) -> Any:
        """``call`` with the cluster's client, as the cluster. A client that failed otherwise than by a deadline
        (a restarted head's GCS is another cluster to it) is made anew next time; one whose GCS did not answer in
        time is kept, and reconnects by itself: making a client waits for the GCS to answer (over 30 s for one
        that accepts connections and never answers), and would hold the loop that long."""
        try:
            with self._as_cluster(cluster_id):
                return call(self._client(cluster_id, port))
        except Exception as exc:
            if getattr(exc, "rpc_code", None) != DEADLINE_EXCEEDED:
                self._clients.pop(cluster_id, None)
            raise

    def _client(self, cluster_id: str, port: int) -> Any:
        cached = self._clients.get(cluster_id)
        if cached and cached[0] == port:
            return cached[1]
        from ray._raylet import GcsClient  # type: ignore[attr-defined]

        client = GcsClient(address=f"127.0.0.1:{port}")
        self._clients[cluster_id] = (port, client)
        return client

    @contextlib.contextmanager
    def _as_cluster(self, cluster_id: str) -> Iterator[None]:
        """Make this process' Ray clients present ``cluster_id``'s token while the block runs."""
        from ray._raylet import AuthenticationTokenLoader  # type: ignore[attr-defined]

        with self._token_lock:
            os.environ.update(ray_auth_environment(self._ray_token(cluster_id)))
            AuthenticationTokenLoader.instance().reset_cache()
            yield

    def _note(self, cluster_id: str, error: str | None) -> None:
        """Log once per change of a cluster's GCS reachability, not once per pass."""
        before = self._errors.get(cluster_id)
        if (before is None) == (error is None):
            return
        if error is None:
            self._errors.pop(cluster_id, None)
            log.info("cluster %s: the GCS answers again", cluster_id)
        else:
            self._errors[cluster_id] = error
            log.warning("cluster %s: %s; its nodes are unknown until it answers", cluster_id, error)


def require_token_mode() -> None:
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
