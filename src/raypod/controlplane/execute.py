"""Applies planned actions through a backend and records one event per action. The only place with side effects
on clusters."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import groupby

from raypod import actions, errors, state
from raypod.backends import base

WARNING_REASONS = frozenset(
    {
        "RemovedDeadNode",
        "NodeStartTimedOut",
        "RestartedWithHead",
        "CleanedUpStrayProcesses",
        "RemovedUnhealthyNode",
        "DrainingUnhealthyNode",
        "RestartedSidecar",
    }
)

EventSink = Callable[[state.EventType, str, str, str | None], None]


@dataclass(frozen=True)
class Outcome:
    action: actions.Action
    error: Exception | None = None

    @property
    def reason(self) -> str:
        verb = type(self.action).__name__
        return self.action.reason if self.error is None else f"FailedTo{verb}"

    @property
    def failed(self) -> bool:
        """It failed; one that could not run yet (``NotYet``) is asked again next pass and is no failure."""
        return self.error is not None and not isinstance(self.error, errors.NotYet)

    @property
    def is_permanent(self) -> bool:
        return isinstance(self.error, errors.PermanentError)


def execute(planned: list[actions.Action], backend: base.Backend, cluster_id: str, record: EventSink) -> list[Outcome]:
    """Apply actions in order; consecutive actions of one kind run concurrently (nodes start in parallel).

    Stops after the first batch with a failure, so a later action never runs on a broken premise.
    """
    outcomes: list[Outcome] = []
    for _, batch_iter in groupby(planned, key=type):
        batch = list(batch_iter)
        if len(batch) == 1:
            results = [_apply(batch[0], backend, cluster_id)]
        else:
            with ThreadPoolExecutor(max_workers=min(len(batch), 16)) as pool:
                results = list(pool.map(lambda action: _apply(action, backend, cluster_id), batch))
        for outcome in results:
            if outcome.error is None or outcome.failed:
                _record(outcome, record)
        outcomes.extend(results)
        if any(outcome.failed for outcome in results):
            break
    return outcomes


def _apply(action: actions.Action, backend: base.Backend, cluster_id: str) -> Outcome:
    try:
        match action:
            case actions.CreateNode(node=node):
                backend.create_node(cluster_id, node)
            case actions.DrainNode(name=name, ray_node_id=ray_node_id, deadline=deadline, message=message):
                backend.drain_node(cluster_id, name, ray_node_id, deadline, message)
            case actions.DeleteNode(name=name, quarantine_s=quarantine_s):
                backend.delete_node(cluster_id, name, quarantine_s=quarantine_s)
            case actions.StartSidecar(name=name, sidecar=sidecar):
                backend.start_sidecar(cluster_id, name, sidecar)
            case actions.DeleteFiles(path=path):
                backend.delete_bind(cluster_id, path)
            case actions.ReleaseCluster():
                backend.release(cluster_id)
    except Exception as exc:  # one failed action must not stop the control plane
        return Outcome(action, exc)
    return Outcome(action)


def _record(outcome: Outcome, record: EventSink) -> None:
    action = outcome.action
    node = getattr(action, "name", None) or (action.node.name if isinstance(action, actions.CreateNode) else None)
    if outcome.error is not None:
        record(state.EventType.WARNING, outcome.reason, f"{action.message}: {outcome.error}", node)
    else:
        kind = state.EventType.WARNING if action.reason in WARNING_REASONS else state.EventType.NORMAL
        record(kind, action.reason, action.message, node)
