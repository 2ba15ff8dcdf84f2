"""Autoscaling's step of the reconcile loop: read Ray's demand, ask Ray's scheduler (capabilities/autoscaling), and
turn its answer into the same resize request a user makes. The loop then starts, drains and stops the nodes."""

from __future__ import annotations

import logging

from raypod import errors, state
from raypod import spec as spec_mod
from raypod.backends import base
from raypod.capabilities.autoscaling import scaler
from raypod.capabilities.observability import metrics
from raypod.controlplane.clusters import ClusterService

log = logging.getLogger(__name__)

HEAD = "head"
MAX_INFEASIBLE_REPORTED = 64  # shapes per cluster: a program that asks for ever new ones is not an event flood


class Autoscaler:
    """Runs inside the reconciler's thread, once a pass for each cluster with ``autoscaling``: no second controller.
    A step that fails (the GCS does not answer, Ray's scheduler raises) is tried again the next pass; the cluster
    keeps its size meanwhile."""

    def __init__(self, clusters: ClusterService) -> None:
        self.clusters = clusters
        self.store = clusters.store
        self.backend = clusters.backend
        self._failing: set[str] = set()
        self._infeasible: dict[str, set[tuple[tuple[tuple[str, float], ...], bool]]] = {}

    def applies_to(self, view: state.ClusterView) -> bool:
        features = self.backend.features
        return (
            view.spec.autoscaling is not None
            and base.Feature.RESOURCE_STATE in features
            and not view.deleting
            and not view.queued
            and bool(scaler.scaling_groups(view.spec))
        )

    def step(self, view: state.ClusterView, observed: state.ObservedCluster) -> state.AutoscalingStatus | None:
        """Resize the cluster's scaling groups from its Ray's demand; return what waits and why (the status'
        ``autoscaling``), None for a cluster the autoscaler does not size."""
        if not self.applies_to(view):
            self._failing.discard(view.uid)
            if view.deleting:  # infeasible demands are reported once while the cluster lives, queued or not
                self._infeasible.pop(view.uid, None)
            return None
        previous = view.status.autoscaling or state.AutoscalingStatus()
        head = observed.nodes.get(HEAD)
        if head is None or head.phase is not state.NodePhase.RUNNING or not observed.gcs_reachable:
            return previous  # nothing to ask until the head's GCS answers; nothing is decided on an unknown
        try:
            raw = self.backend.resource_state(view.uid)
            if raw is None:
                return previous
            decision = scaler.decide(view.spec, observed, raw)
        except Exception as exc:  # Ray's scheduler is not ours: whatever it raises, the loop goes on
            message = exc.message if isinstance(exc, errors.RaypodError) else f"{type(exc).__name__}: {exc}"
            if view.uid not in self._failing:
                log.warning("autoscaler of %s/%s failed: %s", view.spec.namespace, view.spec.name, message)
                failed = f"{message}; the cluster keeps its size"
                self._record(view, state.EventType.WARNING, "AutoscalerFailed", failed)
                self._failing.add(view.uid)
            return previous.model_copy(update={"message": f"the autoscaler failed: {message}"[:500]})
        if view.uid in self._failing:
            self._failing.discard(view.uid)
            self._record(view, state.EventType.NORMAL, "AutoscalerRecovered", "the autoscaler decides again")
        self._report_infeasible(view, decision)
        waits = self._resize(view, decision)
        return state.AutoscalingStatus(pending=[_pending(d, view, waits) for d in decision.demands])

    def _resize(self, view: state.ClusterView, decision: scaler.Decision) -> str | None:
        """Request the decision's resizes; return why a scale-up waits (the queue's reason), if it does."""
        if not decision.resizes:
            if view.pending_spec is not None and all(d.why == scaler.NO_SHAPE_FITS for d in decision.demands):
                self.store.set_pending(view.uid, None)
                self._record(view, state.EventType.NORMAL, "ScaleCancelled", "the demand that asked for it is gone")
                self.clusters.wake(view.uid)
            return view.pending_reason if view.pending_spec is not None else None
        scaled, resizes = view.spec, decision.resizes
        for resize in resizes:
            scaled = scaled.with_replicas(resize.group, resize.after)
        if view.pending_spec is not None and _replicas(view.pending_spec) == _replicas(scaled):
            return view.pending_reason  # asked already: it waits in the queue
        words = "; ".join(f"worker group {r.group}: {r.before} -> {r.after} replicas ({r.why})" for r in resizes)
        reason = "ScaledUp" if any(r.up for r in resizes) else "ScaledDown"
        try:
            waits = self.clusters.resize(view, scaled, reason, words[:2000])
        except (errors.InsufficientCapacity, errors.QuotaExceeded) as exc:
            return f"no room: {exc.message}" if isinstance(exc, errors.InsufficientCapacity) else exc.message
        if waits is None:
            metrics.count_node_event(view.spec.name, view.spec.namespace, reason)
        return waits

    def _report_infeasible(self, view: state.ClusterView, decision: scaler.Decision) -> None:
        """Once for each demand no node of any group could ever hold (while the cluster lives, however often it
        comes and goes in Ray's reports): it is not scaled for."""
        seen = self._infeasible.setdefault(view.uid, set())
        for demand in decision.infeasible:
            key = (demand.shape, demand.placement_group)
            if key in seen or len(seen) >= MAX_INFEASIBLE_REPORTED:
                continue
            seen.add(key)
            groups = ", ".join(f"{g.name} ({g.cpus} CPU, {g.gpus} GPU)" for g in view.spec.worker_groups)
            message = f"{demand.describe()}: no node of any group can hold it (groups: {groups}); not scaled for"
            self._record(view, state.EventType.WARNING, "InfeasibleDemand", message[:2000])

    def _record(self, view: state.ClusterView, kind: state.EventType, reason: str, message: str) -> None:
        self.store.record(view, kind, reason, message)


def _pending(demand: scaler.Demand, view: state.ClusterView, waits: str | None) -> state.PendingDemand:
    reason = demand.why
    if reason == scaler.NODES_STARTING and waits:
        reason = waits if waits.startswith("no room") else f"over quota: {waits}"
    return demand.as_status(reason)


def _replicas(spec: spec_mod.ClusterSpec) -> dict[str, int]:
    return {g.name: g.replicas for g in spec.worker_groups}
