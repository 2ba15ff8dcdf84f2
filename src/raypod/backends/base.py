"""The Backend protocol: how the control plane runs nodes, whatever runs them.

A backend only translates our types into processes or Kubernetes objects and back. It knows nothing about HTTP,
users or quotas, and nothing backend-specific leaks out of it.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from raypod import addons, state
from raypod import spec as spec_mod
from raypod.backends import ray_jobs
from raypod.backends.commands import CommandResult

# What the capabilities add to each node of a cluster (the reconciler's add-on maker, bound to the cluster).
NodeAddonsOf = Callable[[spec_mod.NodeSpec], addons.NodeAddons]


class Feature(StrEnum):
    GPUS = "gpus"
    DRAIN = "drain"
    GCS_FAULT_TOLERANCE = "gcs-fault-tolerance"
    # The backend's own controller runs a cluster object's nodes (KubeRay): raypod applies the whole spec with
    # ``apply`` each pass, and node actions only replace (delete) what the controller then recreates.
    DECLARATIVE = "declarative"
    # The backend calls its change listener whenever what ``observe`` returns for a cluster changes (KubeRay's
    # watches): the loop then leaves settled clusters alone between resyncs instead of observing each every pass.
    CHANGE_EVENTS = "change-events"
    NODE_COMMANDS = "node-commands"  # run_on_node works: user health checks
    SPACES = "spaces"  # workspace nodes with their IDE
    HANGWATCH = "hangwatch"  # the hang detection agent runs on the nodes
    # addon_dirs are on the server's own disk: sidecars leave what the control plane reads there. Without it (pods),
    # a sidecar that reports is given the control plane's address and a credential of its cluster's.
    SHARED_ADDON_DIRS = "shared-addon-dirs"
    KV_STORE = "kv-store"  # kv_store runs a Redis for a cluster's KV cache (the managed L2 tier)
    AUTOSCALING = "autoscaling"  # groups grow and shrink from Ray's demand
    # ``resource_state`` reads Ray's demand, and raypod's loop sizes the groups from it (the local backend). Without
    # it an AUTOSCALING backend runs Ray's autoscaler beside the head (KubeRay's in-tree autoscaler).
    RESOURCE_STATE = "resource-state"


@dataclass(frozen=True)
class HostCapacity:
    """What the machines behind a backend can hold; ``None`` means the backend does not limit it."""

    cpus_per_node: int | None
    memory_bytes: int | None
    shared_memory_bytes: int | None
    gpus_per_node: int | None
    head_overhead_bytes: int = 0
    worker_overhead_bytes: int = 0


@dataclass(frozen=True)
class Tenancy:
    """What separates the clusters of different namespaces on this backend, in words a user can act on."""

    isolated: bool
    summary: str


class Backend(Protocol):
    features: frozenset[Feature]
    tenancy: Tenancy

    def capacity(self) -> HostCapacity: ...

    def apply(
        self, cluster_id: str, spec: spec_mod.ClusterSpec, *, deleting: bool, node_addons: NodeAddonsOf | None = None
    ) -> None:
        """DECLARATIVE backends: make the cluster object match ``spec`` (or delete it); cheap when nothing changed.
        ``node_addons`` says what the capabilities add to a node (rendered into each group's pod template).
        Others do nothing here: the planner's node actions are the whole story."""
        ...

    def observe(self, cluster_id: str) -> state.ObservedCluster: ...

    def set_change_listener(self, listener: Callable[[str], None]) -> None:
        """Where the backend can tell, ``listener(cluster_id)`` is called when the cluster's observation changed
        (see CHANGE_EVENTS); others keep it and may never call it."""
        ...

    def create_node(self, cluster_id: str, node: spec_mod.NodeSpec) -> None: ...

    def drain_node(self, cluster_id: str, name: str, ray_node_id: str, deadline: float, reason: str) -> None: ...

    def resource_state(self, cluster_id: str) -> bytes | None:
        """RESOURCE_STATE backends: what the cluster's GCS says of its nodes' resources and the work waiting for
        them (Ray's ``ClusterResourceState``, serialized), or None while there is no GCS to ask. Raises
        TransientError where the GCS does not answer."""
        ...

    def put_cluster_kv(self, cluster_id: str, namespace: bytes, key: bytes, value: bytes) -> None:
        """Leave ``value`` in the cluster's Ray key-value store (the GCS's), where code inside Ray reads it (the
        preemption notice, say). Raises where the cluster's Ray cannot be reached."""
        ...

    def start_sidecar(self, cluster_id: str, node: str, sidecar: str) -> None:
        """Start one of the sidecars ``observe`` reports for a live node (``ObservedNode.sidecars``), in the node's
        isolation with its environment. ``observe`` starts nothing: this is the loop's action."""
        ...

    def delete_node(self, cluster_id: str, name: str, *, quarantine_s: float = 0.0) -> None:
        """Stop the node for good. ``quarantine_s`` > 0: it is being replaced, so its slot (ports, session
        directory, host) must not be reused for that long."""
        ...

    def run_on_node(self, cluster_id: str, name: str, command: str, timeout_s: float) -> CommandResult:
        """Run a shell command where the node runs, as the node would (its environment, its isolation), killed at
        ``timeout_s``. Raises when it cannot run at all (no such node)."""
        ...

    def addon_dirs(self, cluster_id: str) -> dict[str, Path]:
        """Each node's add-on directory (``{addon_dir}`` of its add-ons: where a sidecar such as hang detection's
        agent writes what the control plane reads), as this host sees it; nodes without add-ons are left out.
        The node may change what is inside: read it without following links (``untrusted_files``)."""
        ...

    def sidecar_token(self, cluster_id: str, node: str, sidecar: str) -> str:
        """A sidecar's own secret (``{token}`` of its add-on), made on first use and kept by the backend: the
        gateway presents the IDE's, users never see it. A sidecar with an ``endpoint`` is published under that
        name in ``observe`` once its probe answers."""
        ...

    def delete_bind(self, cluster_id: str, path: str) -> None:
        """Delete a directory nodes were given (``NodeAddons.binds``: a workspace's files), where it is kept: the
        directory itself here, its PersistentVolumeClaim on Kubernetes."""
        ...

    def hidden_from_nodes(self, cluster_id: str, path: str) -> str | None:
        """Why the cluster's nodes cannot read ``path`` of the server's filesystem (a model directory, say), or
        None where they can."""
        ...

    def kv_store(self, cluster_id: str, max_bytes: int) -> str:
        """Start (or find) a Redis for the cluster's shared KV cache tier, evicting least recently used entries past
        ``max_bytes``; return the path, as the cluster's nodes see it, of a file (0600) holding its URL with its
        password. Raises InvalidSpec where this backend cannot run one (give an L2 address instead)."""
        ...

    def release(self, cluster_id: str) -> None: ...

    def dashboard_headers(self, cluster_id: str) -> dict[str, str]:
        """Headers that authenticate raypod to the cluster's Ray dashboard (users never see them)."""
        ...

    def upstream_tls(self, cluster_id: str) -> ssl.SSLContext | None:
        """How raypod verifies (and presents itself to) the cluster's endpoints where they are https, e.g. the
        Kubernetes API server's proxy with the kubeconfig's CA and client certificate; None: the system's CAs."""
        ...

    def job_api(self, cluster_id: str, dashboard_url: str) -> ray_jobs.RayJobApi:
        """A client of the cluster's Ray job API, authenticated as raypod."""
        ...

    def close(self) -> None: ...


class NodesFollowActions:
    """For a backend that is not DECLARATIVE: ``apply`` does nothing, the planner's node actions are the story."""

    def apply(
        self, cluster_id: str, spec: spec_mod.ClusterSpec, *, deleting: bool, node_addons: NodeAddonsOf | None = None
    ) -> None:
        del cluster_id, spec, deleting, node_addons


@runtime_checkable
class RayJobRunner(Protocol):
    """A backend that can run one job as its own KubeRay ``RayJob`` (``raypod job submit --as-rayjob``)."""

    kueue: bool  # RayJobs carry Kueue's labels: Kueue admits them

    def submit_rayjob(self, manifest: dict[str, Any]) -> None: ...

    def rayjob_status(self, namespace: str, name: str) -> tuple[str, str] | None:
        """Ray's status of the RayJob's job (PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED) and a message, or None
        while the backend has not seen it."""
        ...

    def delete_rayjob(self, namespace: str, name: str) -> None: ...


@dataclass(frozen=True)
class ServiceState:
    """A RayService's application as KubeRay reports it."""

    status: str  # Serve's application status (DEPLOYING, RUNNING, DEPLOY_FAILED, UNHEALTHY, ...)
    message: str
    deployments: dict[str, str]  # Serve deployment -> its status


@runtime_checkable
class ServiceRunner(Protocol):
    """A backend that serves each model deployment as its own KubeRay ``RayService``."""

    kueue: bool

    def apply_rayservice(self, cluster_id: str, manifest: dict[str, Any]) -> None:
        """Create the RayService, or update it when it differs (KubeRay then upgrades without downtime)."""
        ...

    def rayservice_state(self, namespace: str, name: str) -> ServiceState | None:
        """None while the backend has not seen it."""
        ...

    def delete_rayservice(self, namespace: str, name: str) -> None: ...

    def serve_endpoints(self, cluster_id: str) -> dict[str, str]:
        """Application name -> base URL of its RayService's Serve proxy, for the cluster's deployments."""
        ...
