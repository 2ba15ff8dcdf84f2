"""One frozen dataclass per change the planner can ask for. No behaviour: the executor applies them."""

from __future__ import annotations

from dataclasses import dataclass

from raypod import spec as spec_mod


@dataclass(frozen=True)
class CreateNode:
    node: spec_mod.NodeSpec
    reason: str
    message: str


@dataclass(frozen=True)
class DrainNode:
    name: str
    ray_node_id: str
    deadline: float
    reason: str
    message: str


@dataclass(frozen=True)
class DeleteNode:
    name: str
    reason: str
    message: str
    quarantine_s: float = 0.0  # a replaced node's slot (ports, session dir, host) is not reused for this long


@dataclass(frozen=True)
class StartSidecar:
    """Start a process the backend keeps beside a running node (hang detection's agent, a workspace's IDE)."""

    name: str  # the node's
    sidecar: str
    reason: str
    message: str


@dataclass(frozen=True)
class DeleteFiles:
    """Delete a directory a node was given (``NodeAddons.binds``: a workspace's files), now that the node is gone."""

    name: str  # the node's
    path: str
    reason: str = "SpaceFilesDeleted"
    message: str = "the workspace's files deleted"


@dataclass(frozen=True)
class ReleaseCluster:
    """Forget a cluster whose nodes are all gone: frees its ports and temporary files."""

    reason: str = "Deleted"
    message: str = "all nodes stopped; cluster removed"


Action = CreateNode | DrainNode | DeleteNode | StartSidecar | DeleteFiles | ReleaseCluster
