"""Pure planning: desired spec + fresh observation -> ordered actions. No I/O, no clock, no randomness."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from raypod import actions, state
from raypod import spec as spec_mod
from raypod.backends import base
from raypod.capabilities.resilience.model import Verdict

HEAD = "head"
# Deletes that replace a node the cluster still wants: the flapping guard counts them per group.
REPLACEMENT_REASONS = frozenset({"RemovedDeadNode", "NodeStartTimedOut", "RemovedUnhealthyNode"})


@dataclass(frozen=True)
class PlanSettings:
    drain_timeout_s: float = 30.0
    node_start_timeout_s: float = 180.0


DEFAULT_SETTINGS = PlanSettings()


@dataclass(frozen=True)
class Recovery:
    """What the health model and operators say about nodes, for this pass."""

    unhealthy: Mapping[str, Verdict] = field(default_factory=dict)
    replace_requested: frozenset[str] = frozenset()
    cordoned: frozenset[str] = frozenset()
    held_groups: frozenset[str] = frozenset()  # groups that reached their replacement limit
    delete_files: Mapping[str, str] = field(default_factory=dict)  # node -> a directory it was given, once it is gone


NO_RECOVERY = Recovery()


def plan(
    desired: spec_mod.ClusterSpec,
    observed: state.ObservedCluster,
    *,
    deleting: bool,
    now: float,
    features: frozenset[base.Feature],
    settings: PlanSettings = DEFAULT_SETTINGS,
    recovery: Recovery = NO_RECOVERY,
) -> list[actions.Action]:
    """Return the actions that move ``observed`` toward ``desired``: clean-ups and deletes, drains, creates, then
    the sidecars of live nodes that do not run."""
    cleanups: list[actions.Action] = [
        actions.DeleteNode(name, "CleanedUpStrayProcesses", f"processes of unknown node {name} stopped")
        for name in sorted(observed.stray_nodes)
    ]
    if deleting:
        return cleanups + _plan_deletion(observed, _delete_files(recovery.delete_files, observed, set()))

    deletes: list[actions.Action] = []
    drains: list[actions.Action] = []
    creates: list[actions.Action] = []
    gone: set[str] = set()  # nodes this plan deletes: to be recreated if still desired

    head = observed.nodes.get(HEAD)
    # An UNKNOWN head is not a lost one: a GCS that does not answer says nothing about the nodes behind it.
    head_replaced = head is not None and isinstance(
        _recover(head, desired, observed, recovery, now, features, settings), actions.DeleteNode
    )
    head_lost = head is None or head.phase is state.NodePhase.DEAD or head_replaced
    if head_lost and desired.gcs_fault_tolerance is None:
        # Without GCS fault tolerance no worker outlives its head's GCS: restart them with it, as KubeRay does.
        for node in _workers(observed):
            deletes.append(
                actions.DeleteNode(node.name, "RestartedWithHead", "head is gone and GCS is not fault tolerant")
            )
            gone.add(node.name)

    desired_nodes = {node.name: node for node in desired.desired_nodes()}
    for name, node in observed.nodes.items():
        if name in gone or node.phase is state.NodePhase.UNKNOWN:
            continue  # nothing is deleted, drained or replaced on an unknown
        if name in desired_nodes:
            recovering = _recover(node, desired, observed, recovery, now, features, settings)
            if isinstance(recovering, actions.DrainNode):
                drains.append(recovering)
            elif recovering is not None:
                deletes.append(recovering)
                gone.add(name)
            continue
        deletes_or_drain = _retire(node, now, features, settings)
        if isinstance(deletes_or_drain, actions.DrainNode):
            drains.append(deletes_or_drain)
        elif deletes_or_drain is not None:
            deletes.append(deletes_or_drain)

    # Workers join through the head's GCS: a worker started before it answers can time out in Ray's start-up.
    head_running = head is not None and head.phase is state.NodePhase.RUNNING and HEAD not in gone
    for name, wanted in desired_nodes.items():
        if name in observed.nodes and name not in gone:
            continue
        if not wanted.is_head and not head_running:
            continue
        reason = "ReplacedNode" if name in gone else "CreatedHead" if wanted.is_head else "CreatedWorker"
        creates.append(actions.CreateNode(wanted, reason, _describe(wanted)))
    files = _delete_files(recovery.delete_files, observed, set(desired_nodes))
    return cleanups + deletes + drains + creates + _sidecars(observed, desired_nodes, gone) + files


def _delete_files(
    requested: Mapping[str, str], observed: state.ObservedCluster, wanted: set[str]
) -> list[actions.Action]:
    """A directory goes once no node that was given it is wanted or seen (an unknown node may still use it)."""
    return [
        actions.DeleteFiles(node, path, message=f"the files of node {node} deleted ({path})")
        for node, path in sorted(requested.items())
        if node not in wanted and node not in observed.nodes
    ]


def _sidecars(
    observed: state.ObservedCluster, desired_nodes: dict[str, spec_mod.NodeSpec], gone: set[str]
) -> list[actions.Action]:
    """Start the sidecars of live nodes that do not run, as a kubelet restarts a pod's containers: beside the
    node's start (an IDE takes as long to listen as a raylet to join), and again whenever one exits."""
    starts: list[actions.Action] = []
    for name, node in observed.nodes.items():
        if name not in desired_nodes or name in gone:
            continue
        if node.phase not in (state.NodePhase.STARTING, state.NodePhase.RUNNING):
            continue
        for sidecar, found in sorted(node.sidecars.items()):
            if found is state.SidecarState.NOT_STARTED:
                starts.append(actions.StartSidecar(name, sidecar, "StartedSidecar", f"{sidecar} of node {name}"))
            elif found is state.SidecarState.EXITED:
                message = f"{sidecar} of node {name} exited; started again"
                starts.append(actions.StartSidecar(name, sidecar, "RestartedSidecar", message))
    return starts


def _recover(
    node: state.ObservedNode,
    desired: spec_mod.ClusterSpec,
    observed: state.ObservedCluster,
    recovery: Recovery,
    now: float,
    features: frozenset[base.Feature],
    settings: PlanSettings,
) -> actions.DrainNode | actions.DeleteNode | None:
    """Replace a wanted node that died, never came up, is unhealthy, or that an operator asked to replace.

    A cordoned node is left alone; so are the nodes of a group at its replacement limit, unless an operator asks.
    An unhealthy node that still answers is drained first, up to the spec's drain timeout.
    """
    name = node.name
    requested = name in recovery.replace_requested
    if not requested and (name in recovery.cordoned or desired.group_of(name) in recovery.held_groups):
        return None
    quarantine = desired.recovery.quarantine_s
    if node.phase is state.NodePhase.DEAD:
        if requested:  # drained on an operator's request, Ray let it exit
            message = f"an operator asked to replace it; {node.reason}"
            return actions.DeleteNode(name, "RemovedOnRequest", message, quarantine)
        if node.drain_deadline is not None:  # drained because it was unhealthy; Ray let it exit once idle
            message = f"drained after it became unhealthy, then {node.reason or 'it exited'}"
            return actions.DeleteNode(name, "RemovedUnhealthyNode", message, quarantine)
        return actions.DeleteNode(name, "RemovedDeadNode", node.reason or "node died", quarantine)
    if (
        node.phase is state.NodePhase.STARTING
        and observed.gcs_reachable
        and now - node.started_at > settings.node_start_timeout_s
    ):
        message = f"not registered with Ray after {settings.node_start_timeout_s:.0f} s"
        return actions.DeleteNode(name, "NodeStartTimedOut", message, quarantine)
    verdict = recovery.unhealthy.get(name) if desired.node_recovery is spec_mod.NodeRecovery.AUTOMATIC else None
    if requested or verdict is not None:
        why = "an operator asked to replace it" if requested else f"unhealthy ({verdict.reason if verdict else ''})"
        reason = "RemovedOnRequest" if requested else "RemovedUnhealthyNode"
        if node.phase is state.NodePhase.DRAINING:
            if node.drain_deadline is not None and now < node.drain_deadline:
                return None
            return actions.DeleteNode(name, reason, f"{why}; drained", quarantine)
        drain_s = desired.recovery.drain_timeout_s
        answers = verdict.answers if verdict is not None else True
        if (
            answers
            and drain_s > 0
            and node.phase is state.NodePhase.RUNNING
            and node.ray_node_id
            and base.Feature.DRAIN in features
        ):
            return actions.DrainNode(
                name,
                node.ray_node_id,
                deadline=now + drain_s,
                reason="DrainingOnRequest" if requested else "DrainingUnhealthyNode",
                message=f"{why}; running work has {drain_s:g} s before the node is replaced",
            )
        if node.phase is state.NodePhase.STARTING and not requested:
            return None
        suffix = "" if answers else "; it does not answer, so it is not drained"
        return actions.DeleteNode(name, reason, f"{why}{suffix}", quarantine)
    if node.phase is state.NodePhase.DRAINING:
        return actions.DeleteNode(name, "DeletedNode", "scaled back up while draining")
    return None


def park(
    observed: state.ObservedCluster,
    *,
    now: float,
    features: frozenset[base.Feature],
    settings: PlanSettings = DEFAULT_SETTINGS,
    grace_until: float | None = None,
    delete_files: Mapping[str, str] | None = None,
) -> list[actions.Action]:
    """A queued or preempted cluster runs no node: workers are drained first where the backend can (their work
    has the drain's time to finish or checkpoint), then removed; the head goes last, and not before
    ``grace_until`` while it runs (a preempted cluster's jobs were told, and save a checkpoint meanwhile).
    Unknown nodes are left."""
    workers = [node for node in _workers(observed) if node.phase is not state.NodePhase.UNKNOWN]
    planned = [found for node in workers if (found := _retire(node, now, features, settings)) is not None]
    head = observed.nodes.get(HEAD)
    if not workers and head is not None and head.phase is not state.NodePhase.UNKNOWN:
        in_grace = grace_until is not None and now < grace_until and head.phase is state.NodePhase.RUNNING
        if not in_grace:
            planned.append(actions.DeleteNode(head.name, "DeletedNode", "queued: its nodes wait for admission"))
    return planned + _delete_files(delete_files or {}, observed, set())


def _plan_deletion(observed: state.ObservedCluster, files: list[actions.Action]) -> list[actions.Action]:
    if not observed.nodes:
        return [*files, actions.ReleaseCluster()]
    ordered = sorted(observed.nodes.values(), key=lambda node: (node.is_head, node.name))
    return [actions.DeleteNode(node.name, "DeletedNode", "cluster is being deleted") for node in ordered]


def _retire(
    node: state.ObservedNode, now: float, features: frozenset[base.Feature], settings: PlanSettings
) -> actions.Action | None:
    """Remove a node the spec no longer wants; running nodes are drained first so their work can finish."""
    if node.phase is state.NodePhase.RUNNING and node.ray_node_id and base.Feature.DRAIN in features:
        return actions.DrainNode(
            node.name,
            node.ray_node_id,
            deadline=now + settings.drain_timeout_s,
            reason="DrainedNode",
            message=f"scaled down; running work has {settings.drain_timeout_s:.0f} s to finish",
        )
    if node.phase is state.NodePhase.DRAINING:
        if node.drain_deadline is not None and now < node.drain_deadline:
            return None
        return actions.DeleteNode(node.name, "DeletedNode", "scaled down; drain deadline passed")
    message = "scaled down; node was idle and drained" if node.phase is state.NodePhase.DEAD else "scaled down"
    return actions.DeleteNode(node.name, "DeletedNode", message)


def _workers(observed: state.ObservedCluster) -> list[state.ObservedNode]:
    return sorted((n for n in observed.nodes.values() if not n.is_head), key=lambda n: n.name)


def _describe(node: spec_mod.NodeSpec) -> str:
    parts = [f"{node.cpus} CPU", f"{spec_mod.format_bytes(node.memory)} memory"]
    if node.gpus:
        parts.append(f"{node.gpus} GPU")
    return f"node {node.name} (group {node.group}: {', '.join(parts)})"
