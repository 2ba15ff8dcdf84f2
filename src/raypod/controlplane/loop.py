"""The reconcile loop: observe -> plan -> execute -> status, for every cluster, on a timer and when woken."""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta

from raypod import actions, addons, errors, state
from raypod import spec as spec_mod
from raypod.backends import base
from raypod.capabilities.observability import metrics
from raypod.capabilities.resilience import model as health_model
from raypod.capabilities.resilience.gpu import GpuHealth
from raypod.capabilities.resilience.monitor import HealthMonitor, Transition
from raypod.controlplane import execute, plan, status, store

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 60.0
QUIET_RECHECK_S = 30.0
CHANGING_INTERVAL_S = 0.25


class Reconciler:
    """Runs in one background thread of the server; a pass is level-triggered and starts from a fresh view."""

    def __init__(
        self,
        db: store.Store,
        backend: base.Backend,
        *,
        interval_s: float = 1.0,
        settings: plan.PlanSettings = plan.DEFAULT_SETTINGS,
        gcs_unreachable_timeout_s: float = status.DEFAULT_GCS_UNREACHABLE_TIMEOUT_S,
        health: HealthMonitor | None = None,
        scheduler: Callable[[], None] | None = None,
        node_addons: Callable[[str, spec_mod.NodeSpec], addons.NodeAddons] | None = None,
    ) -> None:
        self.store = db
        self.node_addons = node_addons
        self.backend = backend
        gpus = GpuHealth.from_host() if base.Feature.GPUS in backend.features else None
        self.health = health or HealthMonitor(backend, gpus=gpus)
        self.interval_s = interval_s
        self.settings = settings
        self.gcs_unreachable_timeout_s = gcs_unreachable_timeout_s
        self.scheduler = scheduler  # governance: admits queued clusters and preempts, once a pass
        # Autoscaling: resizes a cluster from its Ray's demand (a request like a user's scale) and says what waits.
        self.autoscale: Callable[[state.ClusterView, state.ObservedCluster], state.AutoscalingStatus | None] | None
        self.autoscale = None
        # History: archives a deleted cluster's jobs' logs and events before its nodes stop (once per deletion).
        self.before_delete: Callable[[state.ClusterView], None] | None = None
        # Idle suspension: suspends a cluster that has had nothing running for its suspend_after_idle_s.
        self.suspend_idle: Callable[[state.ClusterView, state.ObservedCluster], None] | None = None
        self._archived: set[str] = set()
        self._wake = threading.Event()
        # Clusters whose spec changed (the API says which): reconciled before the rest of a pass, so a user's change
        # is acted on in milliseconds however many clusters a pass sweeps.
        self._changed: dict[str, None] = {}
        self._changed_lock = threading.Lock()
        # Clusters found settled (Ready, nothing to do): their generation and observation, and until when a pass
        # that sees exactly the same may skip planning (a full pass still runs at least every QUIET_RECHECK_S).
        self._quiet: dict[str, tuple[int, state.ObservedCluster, float]] = {}
        backend.set_change_listener(self.wake)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failures: dict[str, tuple[int, float]] = {}

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="raypod-reconciler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.health.close()

    def wake(self, uid: str | None = None) -> None:
        """Look again now; ``uid``: this cluster changed, reconcile it first."""
        if uid is not None:
            with self._changed_lock:
                self._changed[uid] = None
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            is_settled = True
            try:
                with metrics.RECONCILE_SECONDS.time():
                    is_settled = self.reconcile_all()
            except Exception:
                log.exception("reconcile pass failed")
            # While nodes start or stop, look again soon: a node that just came up unblocks the next step.
            self._wake.wait(self.interval_s if is_settled else min(self.interval_s, CHANGING_INTERVAL_S))

    def reconcile_all(self) -> bool:
        """Reconcile every cluster once, changed ones first and again whenever one changes during the pass; return
        whether all of them are settled (ready, nothing to do)."""
        if self.scheduler is not None:
            try:
                self.scheduler()
            except Exception:
                log.exception("admission pass failed")
        done: set[str] = set()
        is_settled = self._reconcile_changed(done)
        for view in self.store.list():
            if self._stop.is_set():
                break
            is_settled = self._reconcile_changed(done) and is_settled
            if view.uid not in done and not self._is_left_alone(view):
                is_settled = self._reconcile_one(view) and is_settled
            time.sleep(0)  # let the API's threads in between clusters: a fleet's pass is long
        return self._reconcile_changed(done) and is_settled

    def _is_left_alone(self, view: state.ClusterView) -> bool:
        """A settled cluster on a backend that reports changes is not even observed until one is reported (its
        spec changed, the backend called) or its resync is due: the event-driven half of a level-triggered loop."""
        if base.Feature.CHANGE_EVENTS not in self.backend.features or view.deleting or self.health.checks_due(view):
            return False
        quiet = self._quiet.get(view.uid)
        return quiet is not None and quiet[0] == view.generation and time.monotonic() < quiet[2]

    def _reconcile_changed(self, done: set[str]) -> bool:
        with self._changed_lock:
            changed, self._changed = list(self._changed), {}
        is_settled = True
        for uid in changed:
            view = self.store.by_uid(uid)  # fresh: the change is newer than the pass's list
            if view is not None:
                done.add(uid)
                self._quiet.pop(uid, None)  # a node request changes no generation: look at it in full
                self._failures.pop(uid, None)  # a new spec deserves a try now, whatever failed before
                is_settled = self._reconcile_one(view) and is_settled
        return is_settled

    def _reconcile_one(self, view: state.ClusterView) -> bool:
        backoff = self._failures.get(view.uid)
        if backoff and time.monotonic() < backoff[1]:
            return True
        try:
            return self.reconcile(view)
        except Exception:
            log.exception("reconciling %s/%s failed", view.spec.namespace, view.spec.name)
            self._back_off(view.uid)
            return True

    def reconcile(self, view: state.ClusterView) -> bool:
        """One pass for one cluster; return whether it is settled."""
        if view.deleting and self.before_delete is not None and view.uid not in self._archived:
            self._archived.add(view.uid)
            try:
                self.before_delete(view)
                self._record(view, state.EventType.NORMAL, "Archived", "its jobs' logs and its events are kept", None)
            except Exception as exc:  # the deletion goes on: what could not be archived is said
                log.exception("archiving %s/%s failed", view.spec.namespace, view.spec.name)
                message = f"history not kept: {exc}"[:2000]
                self._record(view, state.EventType.WARNING, "ArchiveIncomplete", message, None)
        applied = True
        if base.Feature.DECLARATIVE in self.backend.features:
            try:
                # A queued cluster has no object on the backend: KubeRay would start its pods.
                self.backend.apply(
                    view.uid,
                    view.spec,
                    deleting=view.deleting or view.queued or view.suspended,
                    node_addons=self.addons_of(view.uid),
                )
            except errors.RaypodError as exc:  # observed all the same: what cannot be seen shows as unknown
                self._record(view, state.EventType.WARNING, "FailedToApply", exc.message[:2000], None)
                applied = False
        observed = self.backend.observe(view.uid)
        healths, transitions = self.health.assess(view, observed)
        for transition in transitions:
            self._record_health(view, transition)
        scaling = self.autoscale(view, observed) if self.autoscale is not None else None
        if self.suspend_idle is not None:
            self.suspend_idle(view, observed)
        quiet = self._quiet.get(view.uid)
        if (
            quiet is not None
            and not transitions
            and scaling == view.status.autoscaling
            and not view.deleting
            and quiet[0] == view.generation
            and quiet[1] == observed
            and time.monotonic() < quiet[2]
        ):
            return True  # nothing changed since a pass found it settled: at fleet scale most clusters, most passes
        self._quiet.pop(view.uid, None)
        recovery = self._recovery(view, observed, healths)
        parked = (view.queued or view.suspended) and not view.deleting
        if parked:
            planned = plan.park(
                observed,
                now=time.time(),
                features=self.backend.features,
                settings=self.settings,
                grace_until=view.preempted_until.timestamp() if view.preempted_until else None,
                delete_files=recovery.delete_files,
            )
        else:
            planned = plan.plan(
                view.spec,
                observed,
                deleting=view.deleting,
                now=time.time(),
                features=self.backend.features,
                settings=self.settings,
                recovery=recovery,
            )

        def record(kind: state.EventType, reason: str, message: str, node: str | None) -> None:
            self._record(view, kind, reason, message, node)

        outcomes = execute.execute(self._with_addons(view.uid, planned), self.backend, view.uid, record)
        for outcome in outcomes:
            if isinstance(outcome.action, actions.DeleteFiles) and outcome.error is None:
                self.store.clear_node_request(view.uid, outcome.action.name, store.DELETE_FILES)
        if any(isinstance(o.action, actions.ReleaseCluster) and o.error is None for o in outcomes):
            self._archived.discard(view.uid)
            self.store.remove(view.uid)
            self.health.forget(view.uid)
            self._quiet.pop(view.uid, None)
            self._failures.pop(view.uid, None)
            return True
        if any(o.failed for o in outcomes) or not applied:
            self._back_off(view.uid)
        else:
            self._failures.pop(view.uid, None)
        latest = self.store.latest_node_reasons(view.uid, status.REPLACEMENT_REASONS | status.SETTLED_REASONS)
        derived = status.derive_status(
            view.spec,
            observed,
            outcomes,
            deleting=view.deleting,
            generation=view.generation,
            previous=view.status,
            now=store.now(),
            replacing=frozenset(node for node, reason in latest.items() if reason in status.REPLACEMENT_REASONS),
            gcs_unreachable_timeout_s=self.gcs_unreachable_timeout_s,
            health=healths,
            cordoned=recovery.cordoned,
            held_groups=recovery.held_groups,
        )
        if parked and view.suspended:
            message = "suspended while idle: `raypod cluster resume` or a submitted job brings it back"
            derived = derived.model_copy(update={"phase": state.ClusterPhase.SUSPENDED, "message": message})
        elif parked:
            derived = derived.model_copy(
                update={"phase": state.ClusterPhase.QUEUED, "message": f"queued: {view.queue_reason}"}
            )
        if scaling is not None:
            derived = derived.model_copy(update={"autoscaling": scaling})
        self._record_transitions(view, view.status, derived)
        if derived != view.status:
            self.store.save_status(view.uid, derived)
        is_settled = not planned and derived.phase is state.ClusterPhase.READY
        if is_settled:
            self._quiet[view.uid] = (view.generation, observed, time.monotonic() + QUIET_RECHECK_S)
        return is_settled

    def addons_of(self, cluster_id: str) -> Callable[[spec_mod.NodeSpec], addons.NodeAddons] | None:
        """What the capabilities add to each node of the cluster, as the backend is given it."""
        return functools.partial(self.node_addons, cluster_id) if self.node_addons is not None else None

    def _with_addons(self, cluster_id: str, planned: list[actions.Action]) -> list[actions.Action]:
        """Each node to create with what the capabilities add to it (the plan stays pure: this reads files)."""
        if self.node_addons is None:
            return planned
        return [
            dataclasses.replace(a, node=dataclasses.replace(a.node, addons=self.node_addons(cluster_id, a.node)))
            if isinstance(a, actions.CreateNode)
            else a
            for a in planned
        ]

    def _recovery(
        self,
        view: state.ClusterView,
        observed: state.ObservedCluster,
        healths: dict[str, health_model.NodeHealth],
    ) -> plan.Recovery:
        """The planner's inputs on node recovery: verdicts, operators' requests, and the flapping guard."""
        replace: set[str] = set()
        cordoned: set[str] = set()
        delete_files: dict[str, str] = {}
        for request in self.store.node_requests(view.uid):
            node = observed.nodes.get(request.node)
            if request.kind == store.DELETE_FILES:
                if request.path:
                    delete_files[request.node] = request.path
            elif request.kind == store.CORDON:
                cordoned.add(request.node)
            elif node is None or node.phase is state.NodePhase.UNKNOWN:
                if request.incarnation is not None and node is None:
                    # The node was removed (replaced, or scaled away) since the request was bound: it is done.
                    self.store.clear_node_request(view.uid, request.node, request.kind)
            elif request.incarnation is None:
                self.store.bind_node_request(view.uid, request.node, request.kind, node.incarnation)
                replace.add(request.node)
            elif request.incarnation == node.incarnation:
                replace.add(request.node)
            else:  # a new incarnation runs: the replacement is done
                self.store.clear_node_request(view.uid, request.node, request.kind)
        policy = view.spec.recovery
        since = store.now() - timedelta(seconds=policy.window_s)
        per_group: dict[str, int] = {}
        for node_name, count in self.store.count_node_events(view.uid, plan.REPLACEMENT_REASONS, since).items():
            group = view.spec.group_of(node_name)
            per_group[group] = per_group.get(group, 0) + count
        unhealthy = {}
        for name, node_health in healths.items():
            found = health_model.verdict(node_health)
            if found is not None:
                unhealthy[name] = found
        return plan.Recovery(
            unhealthy=unhealthy,
            replace_requested=frozenset(replace),
            cordoned=frozenset(cordoned),
            held_groups=frozenset(g for g, count in per_group.items() if count >= policy.max_replacements),
            delete_files=delete_files,
        )

    def _record_health(self, view: state.ClusterView, transition: Transition) -> None:
        after = transition.after
        reasons = "; ".join(after.reasons)
        if after.state is state.NodeHealthState.HEALTHY:
            kind, reason, message = state.EventType.NORMAL, "NodeHealthy", f"node {transition.node} is healthy again"
        elif after.state is state.NodeHealthState.UNHEALTHY:
            action = (
                "it will be replaced"
                if view.spec.node_recovery is spec_mod.NodeRecovery.AUTOMATIC
                else "manual recovery: replace it with raypod node replace"
            )
            kind, reason = state.EventType.WARNING, "NodeUnhealthy"
            message = f"node {transition.node} is unhealthy ({reasons}); {action}"
        else:
            kind, reason, message = state.EventType.WARNING, "NodeSuspect", f"node {transition.node}: {reasons}"
        self._record(view, kind, reason, message[:2000], transition.node)

    def _record_transitions(
        self, view: state.ClusterView, before: state.ClusterStatus, after: state.ClusterStatus
    ) -> None:
        """Events for what happened on its own between passes: nodes that came up or died."""
        previous = {node.name: node.phase for node in before.nodes}
        wanted = {node.name for node in view.spec.desired_nodes()}
        for node in after.nodes:
            was = previous.get(node.name)
            if node.phase is state.NodePhase.RUNNING and was not in (state.NodePhase.RUNNING, state.NodePhase.UNKNOWN):
                self._record(
                    view,
                    state.EventType.NORMAL,
                    "NodeStarted",
                    f"node {node.name} is alive in Ray (pid {node.pid})",
                    node.name,
                )
            elif node.phase is state.NodePhase.DEAD and node.name in wanted and was is not state.NodePhase.DEAD:
                self._record(view, state.EventType.WARNING, "NodeDied", f"node {node.name}: {node.reason}", node.name)
        was_reachable, reachable = before.condition("GCSReachable"), after.condition("GCSReachable")
        if reachable is not None and (was_reachable is None or was_reachable.status) and not reachable.status:
            self._record(
                view, state.EventType.WARNING, "GCSUnreachable", f"{reachable.message}; nodes left alone", None
            )
        elif reachable is not None and was_reachable is not None and not was_reachable.status and reachable.status:
            self._record(view, state.EventType.NORMAL, "GCSReachable", "the GCS answers again", None)
        if (
            reachable is not None
            and reachable.reason == "GCSUnreachableTooLong"
            and (was_reachable is None or was_reachable.reason != "GCSUnreachableTooLong")
        ):
            self._record(view, state.EventType.WARNING, "GCSUnreachableTooLong", after.message, None)
        was_held, held = before.condition("ReplacementLimitReached"), after.condition("ReplacementLimitReached")
        if held is not None and held.status and (was_held is None or not was_held.status):
            self._record(view, state.EventType.WARNING, "ReplacementLimitReached", held.message, None)
        if after.phase is not before.phase and after.phase in (state.ClusterPhase.READY, state.ClusterPhase.DEGRADED):
            kind = state.EventType.NORMAL if after.phase is state.ClusterPhase.READY else state.EventType.WARNING
            self._record(view, kind, f"Cluster{after.phase.value}", after.message, None)

    def _record(
        self, view: state.ClusterView, kind: state.EventType, reason: str, message: str, node: str | None
    ) -> None:
        self.store.record(view, kind, reason, message, node)
        metrics.count_node_event(view.spec.name, view.spec.namespace, reason)

    def _back_off(self, uid: str) -> None:
        count = self._failures.get(uid, (0, 0.0))[0] + 1
        self._failures[uid] = (count, time.monotonic() + min(2.0**count, MAX_BACKOFF_S))
