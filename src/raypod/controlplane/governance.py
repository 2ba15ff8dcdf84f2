"""Governance: teams' quotas, the queue of clusters that wait for their team's quota or for the pool, admission in
priority and fair-share order, borrowing and preemption. The decisions are the pure ``admission`` module's; this
service reads the store, applies them, and answers the API."""

from __future__ import annotations

import builtins
import logging
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import timedelta
from typing import Any

from raypod import errors, state
from raypod import spec as spec_mod
from raypod.backends import base
from raypod.backends.kuberay import kueue
from raypod.capabilities.governance import admission
from raypod.capabilities.governance import notice as preemption_notice
from raypod.controlplane import capacity, identity, store

log = logging.getLogger(__name__)

# An admitted cluster's queue_reason when it runs on quota another team left idle: it is preempted first.
BORROWED = "borrowed"
SCALE = "/scale"  # the admission's id of a running cluster's waiting scale-up: "<uid>/scale"


class GovernanceService:
    def __init__(
        self,
        db: store.Store,
        identities: identity.IdentityService,
        backend: base.Backend,
        *,
        priority_classes: dict[str, int],
        priority_teams: dict[str, tuple[str, ...]] | None = None,
        pool: tuple[float | None, int | None, int | None] = (None, None, None),  # CPUs, memory, GPUs
        wake: Callable[[str], None] = lambda uid: None,
        grace_s: float = 30.0,
        admits: bool = True,
    ) -> None:
        self.grace_s = grace_s  # a preempted cluster's work is told, and has this long to save a checkpoint
        self.admits = admits  # False where Kueue admits (raypod's quotas are then exported to it)
        self.store = db
        self.identities = identities
        self.backend = backend
        self.priority_classes = dict(priority_classes)
        # Classes above "normal" preempt other teams' work: only the teams an admin names may use them.
        self.priority_teams = dict(priority_teams or {})
        self._pool_override = pool
        self.wake = wake
        self._lock = threading.Lock()  # admission decisions one at a time: creates and the loop's passes
        self._decided_at: tuple[object, ...] | None = None  # the store's fingerprint at the last decision

    # -- quotas --------------------------------------------------------------------------------------------

    def set_quota(
        self, caller: identity.Principal, team: str, quota: spec_mod.QuotaSpec | None
    ) -> state.QuotaView | None:
        """Set (or, with None, remove) a team's quota. A quota below what the team already runs stops nothing:
        its new work waits. Installation admins only: a team's share of the whole is not the team's to raise
        (its admins divide it among its namespaces). Raises Forbidden (not an installation admin), NotFound."""
        if not caller.is_admin:
            raise errors.Forbidden(
                "only installation admins set a team's quota; a team's admins divide it among its namespaces "
                "(raypod quota set --namespace)"
            )
        if not self.identities.team_exists(team):
            raise errors.NotFound(f"team '{team}' not found")
        self.store.set_quota(team, quota, caller.user)
        self.schedule(force=True)  # a larger quota may admit queued work at once
        return None if quota is None else self.get_quota(caller, team)

    def set_namespace_quota(
        self, caller: identity.Principal, namespace: str, quota: spec_mod.QuotaSpec | None
    ) -> state.QuotaView | None:
        """Cap one namespace inside its team's quota (or, with None, remove the cap). Raises Forbidden (not an
        admin of its team), NotFound (no such namespace), InvalidSpec (``borrow``: a cap borrows nothing)."""
        team = self.identities.namespace_team(namespace)
        if team is None:
            raise errors.NotFound(f"namespace '{namespace}' not found")
        if not (caller.is_admin or caller.teams.get(team) is state.Role.ADMIN):
            raise errors.Forbidden(f"only admins of team '{team}' (or global admins) may set its namespaces' quotas")
        if quota is not None and quota.borrow:
            raise errors.InvalidSpec("borrow: a namespace's quota caps it inside its team's quota and borrows nothing")
        self.store.set_namespace_quota(namespace, quota, caller.user)
        self.schedule(force=True)
        return None if quota is None else self.get_namespace_quota(caller, namespace)

    def get_namespace_quota(self, caller: identity.Principal, namespace: str) -> state.QuotaView:
        """Raises Forbidden (not in its team), NotFound (no such namespace, or no quota of its own)."""
        team = self.identities.namespace_team(namespace)
        if team is None:
            raise errors.NotFound(f"namespace '{namespace}' not found")
        if not (caller.is_admin or team in caller.teams):
            raise errors.Forbidden(f"only members of its team may see namespace '{namespace}'s quotas")
        for view in self._quota_views():
            if view.namespace == namespace:
                return view
        raise errors.NotFound(f"namespace '{namespace}' has no quota of its own (its team's quota applies)")

    def get_quota(self, caller: identity.Principal, team: str) -> state.QuotaView:
        """Raises Forbidden (not in the team), NotFound (no quota set)."""
        if not (caller.is_admin or team in caller.teams):
            raise errors.Forbidden(f"only members of team '{team}' may see its quota")
        views = {view.team: view for view in self._quota_views() if view.namespace is None}
        if team not in views:
            raise errors.NotFound(f"team '{team}' has no quota (it is limited only by the pool)")
        return views[team]

    def list_quotas(self, caller: identity.Principal) -> builtins.list[state.QuotaView]:
        return [v for v in self._quota_views() if caller.is_admin or v.team in caller.teams]

    def queue(self, caller: identity.Principal) -> builtins.list[state.QueueEntry]:
        """What waits, in the order it will be admitted, with why; the caller sees its teams' namespaces."""
        views = self.store.list()
        teams = self._teams()
        usage: dict[str, admission.Resources] = {}
        for run in self._running(views, teams):
            usage[run.workload.team] = usage.get(run.workload.team, admission.Resources()) + run.workload.demand
        waiting = self._waiting(views, teams)
        by_uid = {v.uid: v for v in views}
        entries = []
        for position, item in enumerate(admission.order(waiting, usage, self._quotas()), start=1):
            if not (caller.is_admin or item.team in caller.teams):
                continue
            scale = item.id.endswith(SCALE)
            view = by_uid[item.id.removesuffix(SCALE)]
            entries.append(
                state.QueueEntry(
                    namespace=view.spec.namespace,
                    name=view.spec.name,
                    kind="scale" if scale else "cluster",
                    team=item.team,
                    priority=view.spec.priority,
                    position=position,
                    reason=view.pending_reason if scale else view.queue_reason,
                    submitted_at=(view.pending_since or view.created_at) if scale else view.created_at,
                )
            )
        return entries

    def kueue_objects(self, caller: identity.Principal) -> builtins.list[dict[str, Any]]:
        """Every team's quota, namespace and priority class as Kueue objects (admins: it covers every team)."""
        if not caller.is_admin:
            raise errors.Forbidden("only admins may export every team's quota")
        return kueue.objects(self.store.quotas(), self._teams(), self.priority_classes)

    def delete_user(self, caller: identity.Principal, user: str) -> state.OwnerDeleted:
        """Admins. Its tokens and sessions end at once; its queued clusters leave the queue (deleted, with an
        event); its running clusters stay for their team's admins."""
        identity.require_admin(caller, "delete users")
        self.identities.delete_user(user)
        return self.on_owner_deleted(user)

    def on_owner_deleted(self, user: str) -> state.OwnerDeleted:
        """A deleted user's queued clusters leave the queue (deleted: they run no node, so nothing is lost) with
        an event; its admitted clusters keep running for their team's admins to keep or delete."""
        dropped, kept = [], []
        for view in self.store.list():
            if view.spec.owner != user or view.deleting:
                continue
            where = f"{view.spec.namespace}/{view.spec.name}"
            if view.queued:
                self.store.record(
                    view,
                    state.EventType.WARNING,
                    "DroppedFromQueue",
                    f"its owner, user {user}, was deleted: it leaves the queue and is deleted (it ran no node)",
                )
                self.store.mark_deleting(view.uid)
                self.wake(view.uid)
                dropped.append(where)
            else:
                self.store.record(
                    view, state.EventType.NORMAL, "OwnerDeleted", f"its owner, user {user}, was deleted; it runs on"
                )
                kept.append(where)
        return state.OwnerDeleted(user=user, dropped_from_queue=dropped, kept=kept)

    # -- admission -----------------------------------------------------------------------------------------

    def check_priority(self, spec: spec_mod.ClusterSpec, caller: identity.Principal | None = None) -> None:
        """Raises InvalidSpec (an unknown class), Forbidden (a class above ``normal`` that the caller's team may
        not use: RAYPOD_PRIORITY_TEAMS names who may; installation admins may use any)."""
        if spec.priority not in self.priority_classes:
            known = ", ".join(sorted(self.priority_classes, key=self.priority_classes.__getitem__))
            raise errors.InvalidSpec(f"priority: unknown class '{spec.priority}' (classes: {known})")
        above_normal = self.priority_classes[spec.priority] > self.priority_classes.get("normal", 0)
        if caller is None or caller.is_admin or not above_normal:
            return
        team = self.identities.namespace_team(spec.namespace)
        if team not in self.priority_teams.get(spec.priority, ()):
            raise errors.Forbidden(
                f"priority '{spec.priority}' may preempt other teams' work: only the teams an installation admin "
                f"allows may use it (RAYPOD_PRIORITY_TEAMS), and team '{team}' is not one of them"
            )

    def on_create(self, spec: spec_mod.ClusterSpec, caller: identity.Principal | None = None) -> tuple[bool, str]:
        """Whether ``spec`` waits (is queued), and why; or, admitted at once, a note (``borrowed``). Raises
        QuotaExceeded where the team's policy rejects work beyond its quota; Forbidden (its priority class)."""
        self.check_priority(spec, caller)
        if not self.admits or self._nothing_limits():
            return False, ""
        with self._lock:
            views = self.store.list()
            teams = self._teams()
            team = teams.get(spec.namespace, spec.namespace)
            priority = self.priority_classes[spec.priority]
            new = admission.Workload("(new)", team, priority, float("inf"), self.demand(spec), spec.namespace)
            decided = self._decide_with(new, views, teams)
        if new.id in decided.admitted:
            return False, BORROWED if new.id in decided.borrowed else ""
        reason = decided.why_waiting(new.id)
        self._reject_if_policy(team, spec.namespace, reason, "")
        return True, reason

    def on_scale(self, view: state.ClusterView, scaled: spec_mod.ClusterSpec) -> str | None:
        """None where the scale-up fits now; else why it waits (the caller queues it). Raises QuotaExceeded where
        the team's (or namespace's) policy rejects work beyond its quota."""
        if view.queued or not self.admits:
            return None  # a queued cluster holds nothing: its new size waits with it
        if self._nothing_limits():
            return None
        with self._lock:
            # The request replaces the scale-up the cluster may already have waiting.
            views = [v.model_copy(update={"pending_spec": None}) if v.uid == view.uid else v for v in self.store.list()]
            teams = self._teams()
            team = teams.get(view.spec.namespace, view.spec.namespace)
            extra = self.demand(scaled) - self.demand(view.spec)
            priority = self.priority_classes.get(view.spec.priority, 0)
            new = admission.Workload("(scale)", team, priority, float("inf"), extra, view.spec.namespace, False)
            decided = self._decide_with(new, views, teams)
        if new.id in decided.admitted:
            return None
        reason = decided.why_waiting(new.id)
        self._reject_if_policy(team, view.spec.namespace, reason, "; a running cluster keeps its size")
        return reason

    def _nothing_limits(self) -> bool:
        """No quota, no pool and nothing queued: any request fits at once, without reading every cluster (a
        fleet's scale calls would otherwise each walk thousands of clusters)."""
        limited = self.store.quotas() or self.store.namespace_quotas()
        return self.pool() is None and not limited and not self.store.any_queued()

    def _decide_with(
        self, new: admission.Workload, views: builtins.list[state.ClusterView], teams: dict[str, str]
    ) -> admission.Admission:
        queued = admission.WorkQueue(self._waiting(views, teams))
        queued.add(new)
        return admission.admit(
            queued, self._running(views, teams), self._quotas(), self.pool(), self._namespace_quotas()
        )

    def _reject_if_policy(self, team: str, namespace: str, reason: str, note: str) -> None:
        for owner, quota in (
            (f"team {team}", self.store.quotas().get(team)),
            (f"namespace {namespace}", self.store.namespace_quotas().get(namespace)),
        ):
            rejects = quota is not None and quota.policy is spec_mod.QuotaPolicy.REJECT
            if rejects and reason.startswith(f"{owner} is at its quota"):
                raise errors.QuotaExceeded(f"{reason}; {owner} rejects work beyond its quota{note}")

    def schedule(self, *, force: bool = False) -> None:
        """One admission pass over the queue: admit what fits, note why the rest waits, preempt what must give
        way. The reconcile loop calls it every pass; unless ``force``d it decides only when a cluster was added,
        removed, changed, queued or admitted since the last decision (one small query otherwise)."""
        if not self.admits:
            return
        with self._lock:
            fingerprint = self.store.fingerprint()
            if not force and fingerprint == self._decided_at:
                return
            self._decided_at = fingerprint
            views = self.store.list()
            teams = self._teams()
            waiting = self._waiting(views, teams)
            if not waiting and not any(v.queue_reason == BORROWED for v in views):
                return  # nothing waits and nothing borrowed may have to be given back
            by_uid = {v.uid: v for v in views}
            decided = admission.admit(
                admission.WorkQueue(waiting),
                self._running(views, teams),
                self._quotas(),
                self.pool(),
                self._namespace_quotas(),
            )
            scales = {w.id for w in waiting if w.id.endswith(SCALE)}
            for id_ in scales:
                view = by_uid[id_.removesuffix(SCALE)]
                if id_ in decided.admitted and view.pending_spec is not None:
                    self.store.admit_pending(view.uid, view.pending_spec)
                    self.store.record(view, state.EventType.NORMAL, "ScaleAdmitted", _scale_words(view))
                    self.wake(view.uid)
                elif id_ not in decided.admitted:
                    reason = _named(decided.why_waiting(id_), by_uid)
                    if reason != view.pending_reason:
                        self.store.set_pending_reason(view.uid, reason)
            queued = [v for v in views if v.queued and not v.deleting]
            changed: list[tuple[state.ClusterView, bool, str, str, str]] = []  # view, queued, reason, event, message
            for uid in (u for u in decided.admitted if u not in scales):
                borrowed = uid in decided.borrowed
                note = " on quota borrowed from other teams" if borrowed else ""
                changed.append((by_uid[uid], False, BORROWED if borrowed else "", "Admitted", f"admitted{note}"))
            grace_until = store.now() + timedelta(seconds=self.grace_s)
            for uid, why in decided.preempted.items():
                why = _named(why, by_uid)
                message = f"preempted {why}; its work has {self.grace_s:g} s to save a checkpoint, then it is queued"
                changed.append((by_uid[uid], True, f"preempted {why}", "Preempted", message))
            for view in queued:
                if view.uid not in decided.admitted:
                    reason = _named(decided.why_waiting(view.uid), by_uid)
                    if reason != view.queue_reason:
                        changed.append((view, True, reason, "", ""))
            for view, is_queued, reason, event, message in changed:
                preempted = event == "Preempted"
                self.store.set_queued(view.uid, is_queued, reason, grace_until if preempted else None)
                if event:
                    kind = state.EventType.WARNING if preempted else state.EventType.NORMAL
                    self.store.record(view, kind, event, message)
        for view, _, reason, event, _ in changed:
            if event == "Preempted":
                self._notify(view, grace_until.timestamp(), reason)
            elif event == "Admitted" and view.preempted_until and view.preempted_until > store.now():
                self._notify(view, 0.0, "withdrawn: admitted again")  # a past deadline: no notice
            if event:
                self.wake(view.uid)

    def _notify(self, view: state.ClusterView, deadline: float, reason: str) -> None:
        """Leave the preemption notice in the cluster's Ray; a cluster that cannot be told still gets its grace."""
        try:
            notice = preemption_notice.Notice(deadline, reason)
            self.backend.put_cluster_kv(view.uid, preemption_notice.NAMESPACE, preemption_notice.KEY, notice.encode())
        except errors.RaypodError as exc:
            self.store.record(
                view, state.EventType.WARNING, "PreemptionNoticeFailed", f"its work was not told: {exc.message}"
            )

    def demand(self, spec: spec_mod.ClusterSpec) -> admission.Resources:
        nodes = spec.desired_nodes()
        return admission.Resources(
            cpus=float(sum(node.cpus for node in nodes)),
            memory=capacity.memory_needed(spec, self.backend.capacity()),
            gpus=sum(node.gpus for node in nodes),
            clusters=1,
            nodes=len(nodes),
        )

    def pool(self) -> admission.Resources | None:
        """What admission fills: the settings' pool, else what the backend's machines hold (one host's memory and
        GPUs on the local backend); CPUs are Ray's logical ones, unlimited unless set. None: no limit at all."""
        cpus, memory, gpus = self._pool_override
        host = self.backend.capacity()
        memory = memory if memory is not None else host.memory_bytes
        gpus = gpus if gpus is not None else host.gpus_per_node
        if cpus is None and memory is None and gpus is None:
            return None
        return admission.Resources(
            cpus=cpus if cpus is not None else float("inf"),
            memory=memory if memory is not None else 2**62,
            gpus=gpus if gpus is not None else 2**31,
        )

    # -- inside --------------------------------------------------------------------------------------------

    def _teams(self) -> dict[str, str]:
        return {ns.name: ns.team for ns in self.identities.list_namespaces()}

    def _quotas(self) -> dict[str, admission.Quota]:
        return {
            team: admission.Quota(
                cpus=q.cpus, memory=q.memory, gpus=q.gpus, clusters=q.clusters, nodes=q.nodes, borrow=q.borrow
            )
            for team, q in self.store.quotas().items()
        }

    def _namespace_quotas(self) -> dict[str, admission.Quota]:
        return {
            namespace: admission.Quota(cpus=q.cpus, memory=q.memory, gpus=q.gpus, clusters=q.clusters, nodes=q.nodes)
            for namespace, q in self.store.namespace_quotas().items()
        }

    def _workload(self, view: state.ClusterView, teams: dict[str, str]) -> admission.Workload:
        return admission.Workload(
            id=view.uid,
            team=teams.get(view.spec.namespace, view.spec.namespace),
            priority=self.priority_classes.get(view.spec.priority, 0),
            submitted_at=view.created_at.timestamp(),
            demand=self.demand(view.spec),
            namespace=view.spec.namespace,
        )

    def _waiting(self, views: Iterable[state.ClusterView], teams: dict[str, str]) -> list[admission.Workload]:
        """Queued clusters, and running clusters' scale-ups that wait (ids ``<uid>/scale``, the extra they ask)."""
        found = []
        for view in views:
            if view.deleting or view.suspended:
                continue
            if view.queued:
                found.append(self._workload(view, teams))
            elif view.pending_spec is not None:
                current = self._workload(view, teams)
                found.append(
                    replace(
                        current,
                        id=view.uid + SCALE,
                        submitted_at=(view.pending_since or view.created_at).timestamp(),
                        demand=self.demand(view.pending_spec) - current.demand,
                        may_borrow=False,
                    )
                )
        return found

    def _running(self, views: Iterable[state.ClusterView], teams: dict[str, str]) -> list[admission.Running]:
        """Admitted clusters, those being deleted included: their nodes hold the machines until they are gone."""
        return [
            admission.Running(self._workload(v, teams), borrowed=v.queue_reason == BORROWED)
            for v in views
            if not v.queued and not v.suspended
        ]

    def _quota_views(self) -> builtins.list[state.QuotaView]:
        views = self.store.list()
        teams = self._teams()
        usage: dict[str, admission.Resources] = {}  # by team, and by namespace under "ns/<name>"
        borrowed: dict[str, admission.Resources] = {}
        queued: dict[str, int] = {}
        for view in views:
            team = teams.get(view.spec.namespace, view.spec.namespace)
            keys = (team, f"ns/{view.spec.namespace}")
            if view.queued or (view.pending_spec is not None and not view.deleting):
                for key in keys:
                    queued[key] = queued.get(key, 0) + (0 if view.deleting else 1)
            if view.queued or view.suspended:
                continue  # a cluster being deleted holds its nodes until they are gone: it counts below
            demand = self.demand(view.spec)
            for key in keys:
                usage[key] = usage.get(key, admission.Resources()) + demand
            if view.queue_reason == BORROWED:
                borrowed[team] = borrowed.get(team, admission.Resources()) + demand
        found = [
            state.QuotaView(
                team=team,
                quota=quota,
                usage=_amounts(usage.get(team, admission.Resources())),
                borrowed=_amounts(borrowed[team]) if team in borrowed else {},
                queued=queued.get(team, 0),
            )
            for team, quota in sorted(self.store.quotas().items())
        ]
        for namespace, quota in sorted(self.store.namespace_quotas().items()):
            key = f"ns/{namespace}"
            found.append(
                state.QuotaView(
                    team=teams.get(namespace, namespace),
                    namespace=namespace,
                    quota=quota,
                    usage=_amounts(usage.get(key, admission.Resources())),
                    queued=queued.get(key, 0),
                )
            )
        return found


def _scale_words(view: state.ClusterView) -> str:
    assert view.pending_spec is not None
    before, after = len(view.spec.desired_nodes()), len(view.pending_spec.desired_nodes())
    return f"scale-up admitted: {before} -> {after} nodes"


_UID = re.compile(r"\b[0-9a-f]{16}\b")


def _named(text: str, by_uid: dict[str, state.ClusterView]) -> str:
    """``text`` with the admission's cluster ids as the ``namespace/name`` users know."""

    def name(found: re.Match[str]) -> str:
        view = by_uid.get(found.group())
        return f"{view.spec.namespace}/{view.spec.name}" if view else found.group()

    return _UID.sub(name, text)


def _amounts(value: admission.Resources) -> dict[str, float]:
    return {name: float(getattr(value, name)) for name in admission.RESOURCES}
