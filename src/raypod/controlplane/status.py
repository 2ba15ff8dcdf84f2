"""Pure status derivation: observation + action outcomes -> phase and conditions. Computed, never accumulated."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from raypod import spec as spec_mod
from raypod import state
from raypod.capabilities.resilience.model import NodeHealth
from raypod.controlplane import execute

# The latest lifecycle event of a node that says it is being replaced (see ``replacing`` below).
REPLACEMENT_REASONS = frozenset(
    {
        "NodeDied",
        "RemovedDeadNode",
        "NodeStartTimedOut",
        "RestartedWithHead",
        "ReplacedNode",
        "NodeUnhealthy",
        "DrainingUnhealthyNode",
        "RemovedUnhealthyNode",
        "DrainingOnRequest",
        "RemovedOnRequest",
    }
)
# ... and those that say it is not (it came up, or it was created or removed on purpose).
SETTLED_REASONS = frozenset({"NodeStarted", "CreatedHead", "CreatedWorker", "DeletedNode", "DrainedNode"})
DEFAULT_GCS_UNREACHABLE_TIMEOUT_S = 60.0


def derive_status(
    desired: spec_mod.ClusterSpec,
    observed: state.ObservedCluster,
    outcomes: list[execute.Outcome],
    *,
    deleting: bool,
    generation: int,
    previous: state.ClusterStatus,
    now: datetime,
    replacing: frozenset[str] = frozenset(),
    gcs_unreachable_timeout_s: float = DEFAULT_GCS_UNREACHABLE_TIMEOUT_S,
    health: Mapping[str, NodeHealth] | None = None,
    cordoned: frozenset[str] = frozenset(),
    held_groups: frozenset[str] = frozenset(),
) -> state.ClusterStatus:
    """Return the status a user sees, from this observation and the recorded events only.

    ``replacing`` names the nodes whose latest lifecycle event (in the store, so a restarted server sees the
    same) says they died or are being replaced. ``health`` is the health model's view of each node this pass;
    ``held_groups`` are groups at their replacement limit. ``previous`` is read for nothing but the transition
    times of conditions, which they keep while their status holds.
    """
    health = health or {}
    desired_names = [node.name for node in desired.desired_nodes()]
    running = {n.name for n in observed.nodes.values() if n.phase is state.NodePhase.RUNNING}
    ready = sum(1 for name in desired_names if name in running)
    head = observed.head
    head_ready = head is not None and head.phase is state.NodePhase.RUNNING
    failures = [o for o in outcomes if o.failed]
    permanent = [o for o in failures if o.is_permanent]

    surplus = sorted(name for name in observed.nodes if name not in set(desired_names))
    counts = f"{ready}/{len(desired_names)} nodes running"
    lost = [name for name in desired_names if name in replacing and name not in running]
    unknown = [n.name for n in observed.nodes.values() if n.phase is state.NodePhase.UNKNOWN]
    gcs = _condition(
        previous,
        "GCSReachable",
        observed.gcs_reachable,
        "GCSAnswering" if observed.gcs_reachable else "GCSNotAnswering",
        observed.gcs_error,
        now,
    )
    unreachable_s = 0.0 if observed.gcs_reachable else (now - gcs.last_transition).total_seconds()
    if unreachable_s > gcs_unreachable_timeout_s:
        gcs = gcs.model_copy(update={"reason": "GCSUnreachableTooLong"})
    unhealthy = sorted(
        name for name in desired_names if name in health and health[name].state is state.NodeHealthState.UNHEALTHY
    )
    held = sorted(held_groups & {node.group for node in desired.desired_nodes()})
    recovery = desired.recovery
    held_message = (
        f"group(s) {', '.join(held)} reached {recovery.max_replacements} replacement(s) in {recovery.window_s:g} s; "
        "their nodes are left as they are until the window passes (raypod node replace still works)"
        if held
        else ""
    )
    if deleting:
        phase, message = state.ClusterPhase.DELETING, f"stopping {len(observed.nodes)} node(s)"
    elif permanent:
        phase, message = state.ClusterPhase.FAILED, str(permanent[0].error)
    elif not observed.gcs_reachable:
        phase = state.ClusterPhase.UNKNOWN
        message = f"the GCS has not answered for {unreachable_s:.0f} s; {len(unknown)} node(s) unknown, left alone"
    elif head_ready and held:
        phase, message = state.ClusterPhase.DEGRADED, f"{counts}; {held_message}"
    elif head_ready and unhealthy:
        what = "replacing" if desired.node_recovery is spec_mod.NodeRecovery.AUTOMATIC else "manual recovery:"
        phase, message = state.ClusterPhase.DEGRADED, f"{counts}; {what} unhealthy node(s) {', '.join(unhealthy)}"
    elif ready == len(desired_names) and not surplus:
        phase, message = state.ClusterPhase.READY, counts
    elif head_ready and lost:
        phase, message = state.ClusterPhase.DEGRADED, f"{counts}; replacing lost nodes"
    elif surplus:
        phase, message = state.ClusterPhase.PROVISIONING, f"{counts}; removing {', '.join(surplus)}"
    else:
        phase, message = state.ClusterPhase.PROVISIONING, counts

    if phase is state.ClusterPhase.DEGRADED and failures:
        message += f" (cannot yet: {failures[0].error})"
    conditions = [
        _condition(
            previous,
            "HeadReady",
            head_ready,
            "HeadRunning" if head_ready else "HeadNotRunning",
            head.reason if head and not head_ready else "",
            now,
        ),
        _condition(
            previous,
            "Provisioned",
            ready == len(desired_names),
            "AllNodesRunning" if ready == len(desired_names) else "NodesPending",
            f"{ready}/{len(desired_names)} nodes running",
            now,
        ),
        _condition(
            previous,
            "ReplicaFailure",
            bool(failures),
            failures[0].reason if failures else "NoFailure",
            str(failures[0].error) if failures else "",
            now,
        ),
        gcs,
        _condition(
            previous,
            "NodesHealthy",
            not unhealthy,
            "AllHealthy" if not unhealthy else "NodesUnhealthy",
            "; ".join(f"{name}: {', '.join(health[name].reasons)}" for name in unhealthy)[:1000],
            now,
        ),
        _condition(
            previous,
            "ReplacementLimitReached",
            bool(held),
            "ReplacementLimitReached" if held else "WithinLimit",
            held_message,
            now,
        ),
    ]
    unassessed = NodeHealth(state.NodeHealthState.UNKNOWN)
    nodes = [
        state.NodeStatus(
            **vars(n),  # what NodeStatus shows of the observed node; the rest it ignores
            health=health.get(n.name, unassessed).state,
            health_reasons=health.get(n.name, unassessed).reasons,
            cordoned=n.name in cordoned,
        )
        for n in sorted(observed.nodes.values(), key=lambda n: (not n.is_head, n.group, _index(n.name)))
    ]
    return state.ClusterStatus(
        phase=phase,
        message=message,
        desired_nodes=len(desired_names),
        ready_nodes=ready,
        nodes=nodes,
        endpoints=dict(observed.endpoints),
        conditions=conditions,
        observed_generation=generation,
    )


def _condition(
    previous: state.ClusterStatus, type_: str, status: bool, reason: str, message: str, now: datetime
) -> state.Condition:
    before = previous.condition(type_)
    since = before.last_transition if before is not None and before.status == status else now
    return state.Condition(type=type_, status=status, reason=reason, message=message, last_transition=since)


def _index(name: str) -> int:
    suffix = name.rsplit("-", 1)[-1]
    return int(suffix) if suffix.isdigit() else -1
