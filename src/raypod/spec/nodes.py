"""One node the backend must run: a group's resources resolved for a single node."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from raypod import addons as addons_mod
from raypod.spec.hangwatch import HangwatchSpec
from raypod.spec.spaces import SpaceSpec

if TYPE_CHECKING:
    from raypod.spec import NodeGroupSpec


def node_name(group: str, index: int) -> str:
    """Name of the ``index``-th node of a worker group; scale-down removes the highest indices first."""
    return f"{group}-{index}"


HANGWATCH_SIDECAR = "hangwatch-agent"  # hang detection's agent (capabilities/hangwatch)
IDE_SIDECAR = "ide"  # a workspace's IDE (capabilities/spaces)


@dataclass(frozen=True)
class NodeSpec:
    """One node the backend must run: a group's resources resolved for a single node."""

    name: str
    group: str
    is_head: bool
    cpus: int
    memory: int
    object_store_memory: int
    gpus: int = 0
    resources: dict[str, float] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    managed_redis: bool = False  # a head whose GCS stores its state in a Redis the backend runs
    hangwatch: HangwatchSpec | None = None  # the hang detection agent's settings, when it runs on the node
    space: SpaceSpec | None = None  # the workspace whose IDE the node hosts
    space_path: str = ""  # the workspace's URL path on raypod's server (its IDE's base URL)
    # What the capabilities add to the node (files, environment, sidecars): attached by the planner when it creates
    # the node, translated by the backend.
    addons: addons_mod.NodeAddons = addons_mod.NONE

    def sidecars(self) -> tuple[str, ...]:
        """The processes a backend keeps beside this node (``ObservedNode.sidecars`` reports them by these names)."""
        return tuple(sidecar.name for sidecar in self.addons.sidecars)

    @classmethod
    def from_group(cls, group: str, name: str, spec: NodeGroupSpec, env: dict[str, str], *, is_head: bool) -> NodeSpec:
        return cls(
            name=name,
            group=group,
            is_head=is_head,
            cpus=spec.cpus,
            memory=spec.memory,
            object_store_memory=spec.object_store_memory,
            gpus=spec.gpus,
            resources=dict(spec.resources),
            labels=dict(spec.labels),
            env=dict(env),
        )
