"""The verbs the API calls: create, get, list, scale, delete, events. Validates, persists and wakes the loop;
the loop makes it true."""

from __future__ import annotations

import builtins
import dataclasses
import ssl
from collections.abc import Callable

from raypod import errors, state
from raypod import spec as spec_mod
from raypod.backends import base
from raypod.controlplane import capacity, identity, store
from raypod.controlplane.governance import GovernanceService

Principal = identity.Principal
Verb = identity.Verb


@dataclasses.dataclass(frozen=True)
class Upstream:
    """How the gateway reaches a cluster's dashboard and Serve, and whose it is (it asks its one authorization
    question with ``owner`` and ``team``)."""

    view: state.ClusterView
    team: str | None
    headers: dict[str, str]  # the cluster's own Ray credentials
    tls: ssl.SSLContext | None  # how https upstreams are verified; None: the system's CAs
    serve_apps: dict[str, str]  # app -> its own Serve proxy (a RayService's)


class ClusterService:
    """Every verb takes the caller: authorization happens here, once, for the API and the gateway alike."""

    def __init__(
        self,
        db: store.Store,
        backend: base.Backend,
        identities: identity.IdentityService,
        wake: Callable[[str], None] = lambda uid: None,
        governance: GovernanceService | None = None,
    ) -> None:
        self.store = db
        self.backend = backend
        self.identities = identities
        self.wake = wake
        self.governance = governance

    def authorize(self, caller: Principal, verb: identity.Verb, namespace: str, owner: str | None = None) -> None:
        identity.authorize(caller, verb, namespace, self.identities.namespace_team(namespace), owner)

    def create(self, caller: Principal, spec: spec_mod.ClusterSpec) -> state.ClusterView:
        """Admit a cluster owned by the caller (admins may name another owner); nothing starts unless every
        check passes.

        Raises:
            Forbidden, InvalidSpec, InsufficientCapacity, AlreadyExists.
        """
        self.authorize(caller, Verb.CREATE, spec.namespace)
        if spec.owner is None or not caller.is_admin:
            spec = spec.model_copy(update={"owner": caller.user})
        spec = self.admit_spaces(caller, spec.namespace, spec, spec.spaces)
        capacity.check_features(spec, self.backend.features)
        queued, reason = False, ""
        if self.governance is None:
            self.check_capacity(spec)
        else:
            # What can never fit is refused; what does not fit beside the others, or beyond the team's quota, waits.
            capacity.check_capacity(spec, [], self.backend.capacity())
            queued, reason = self.governance.on_create(spec, caller)
        view = self.store.insert(spec, queued=queued, reason=reason)
        self.store.record(view, state.EventType.NORMAL, "Created", _summary(spec))
        if queued:
            self.store.record(view, state.EventType.NORMAL, "Queued", f"queued: {reason}")
        self.wake(view.uid)
        return view

    def admit_spaces(
        self,
        caller: Principal,
        namespace: str,
        spec: spec_mod.ClusterSpec,
        new: builtins.list[spec_mod.SpaceSpec],
    ) -> spec_mod.ClusterSpec:
        """``spec`` with its ``new`` workspaces admitted, whichever route adds them: a name is unique in the
        namespace (the gateway and the files find a workspace by it), and the owner is the caller unless an
        admin of the namespace's team (or of the installation) names another.

        Raises:
            AlreadyExists: a workspace of that name is in the namespace."""
        if not new:
            return spec
        taken = {space.name: view.spec.name for view in self.store.list(namespace) for space in view.spec.spaces}
        for space in new:
            if space.name in taken:
                raise errors.AlreadyExists(
                    f"workspace '{space.name}' already exists in namespace '{namespace}' (on cluster "
                    f"{taken[space.name]})"
                )
        team = self.identities.namespace_team(namespace)
        names_owner = caller.is_admin or (team is not None and caller.teams.get(team) is state.Role.ADMIN)
        admitted = {
            space.name: space.model_copy(update={"owner": space.owner if names_owner and space.owner else caller.user})
            for space in new
        }
        return spec.model_copy(update={"spaces": [admitted.get(space.name, space) for space in spec.spaces]})

    def check_capacity(self, spec: spec_mod.ClusterSpec, *, excluding: str | None = None) -> None:
        """Whether ``spec`` fits beside every other cluster (``excluding`` its own earlier version). Other clusters'
        specs are read only when the backend limits memory: a fleet of thousands costs nothing on Kubernetes.

        Raises:
            InsufficientCapacity.
        """
        host = self.backend.capacity()
        others: list[spec_mod.ClusterSpec] = []
        if host.memory_bytes is not None or host.shared_memory_bytes is not None:
            others = [
                other
                for other in self.store.specs(excluding=excluding)
                if (other.namespace, other.name) != (spec.namespace, spec.name)
            ]
        capacity.check_capacity(spec, others, host)

    def get(self, caller: Principal, namespace: str, name: str, verb: Verb = Verb.VIEW) -> state.ClusterView:
        """Raises Forbidden before NotFound, so names in other teams' namespaces do not leak."""
        self.authorize(caller, Verb.VIEW, namespace)
        view = self.store.get(namespace, name)
        if verb is not Verb.VIEW:
            self.authorize(caller, verb, namespace, view.spec.owner)
        return view

    def upstream(self, namespace: str, name: str) -> Upstream:
        """For the gateway, which authorizes the caller before anything it proxies. Raises NotFound."""
        view = self.store.get(namespace, name, list_known=False)
        runner = self.backend if isinstance(self.backend, base.ServiceRunner) and not view.deleting else None
        return Upstream(
            view=view,
            team=self.identities.namespace_team(namespace),
            headers=self.backend.dashboard_headers(view.uid),
            tls=self.backend.upstream_tls(view.uid),
            serve_apps=runner.serve_endpoints(view.uid) if runner else {},
        )

    def list(
        self,
        caller: Principal,
        namespace: str | None = None,
        *,
        after: tuple[str, str] | None = None,
        limit: int | None = None,
    ) -> list[state.ClusterView]:
        """Clusters in the namespaces the caller may view, by namespace and name; ``after``/``limit``: one page."""
        visible = None
        if not caller.is_admin:
            visible = {ns.name for ns in self.identities.list_namespaces() if ns.team in caller.teams}
        return self.store.list(namespace, namespaces=visible, after=after, limit=limit)

    def scale(self, caller: Principal, namespace: str, name: str, group: str, replicas: int) -> state.ClusterView:
        """Set one worker group's replicas; running nodes removed by a scale-down are drained first.

        Raises:
            NotFound: unknown cluster or group. InvalidSpec: replicas out of bounds.
            Conflict: the cluster is being deleted. InsufficientCapacity. QuotaExceeded (the team rejects work
            beyond its quota). A scale-up beyond the quota otherwise waits in the queue (``pending_spec``).
        """
        view = self.get(caller, namespace, name, Verb.OPERATE)
        if view.deleting:
            raise errors.Conflict(f"cluster '{name}' is being deleted; it cannot be scaled")
        before = view.spec.group(group).replicas
        scaled = view.spec.with_replicas(group, replicas)
        self.resize(view, scaled, "Scaled", f"worker group {group}: {before} -> {replicas} replicas")
        return self.store.get(namespace, name)

    def resize(self, view: state.ClusterView, scaled: spec_mod.ClusterSpec, reason: str, message: str) -> str | None:
        """Make ``scaled`` (the cluster with other replicas) its spec: at once where no group grows or governance
        admits the growth; else it waits in the queue, and why is returned. A user's scale and the autoscaler's
        are the same request.

        Raises:
            InsufficientCapacity. QuotaExceeded (the team rejects work beyond its quota).
        """
        if any(g.replicas > view.spec.group(g.name).replicas for g in scaled.worker_groups):
            self.check_capacity(scaled, excluding=view.uid)
            waits = self.governance.on_scale(view, scaled) if self.governance is not None else None
            if waits is not None:
                self.store.set_pending(view.uid, scaled, waits)
                self.store.record(view, state.EventType.NORMAL, "ScaleQueued", f"{message} waits: {waits}")
                self.wake(view.uid)
                return waits
        if view.pending_spec is not None:
            self.store.set_pending(view.uid, None)  # this request replaces the scale-up that waited
            self.store.record(view, state.EventType.NORMAL, "ScaleCancelled", "the scale-up that waited is replaced")
        self.store.update_spec(view.uid, scaled)
        self.store.record(view, state.EventType.NORMAL, reason, message)
        self.wake(view.uid)
        return None

    def suspend(self, view: state.ClusterView, why: str) -> None:
        """Suspend an idle cluster (the loop's idle suspension): its nodes stop, its quota is given back at once,
        its spec and files stay. ``resume`` brings it back."""
        self.store.set_suspended(view.uid, True)
        message = f"suspended: {why}; `raypod cluster resume {view.spec.name}` or a submitted job brings it back"
        self.store.record(view, state.EventType.NORMAL, "Suspended", message)
        self.wake(view.uid)

    def resume(self, caller: Principal, namespace: str, name: str) -> state.ClusterView:
        """Bring a suspended cluster back: admitted as a new cluster would be (it queues with its reason when its
        team is at its quota). Resuming a cluster that is not suspended does nothing.

        Raises:
            NotFound, Forbidden, Conflict (being deleted), QuotaExceeded (the team rejects work beyond its quota).
        """
        view = self.get(caller, namespace, name, Verb.OPERATE)
        if view.deleting:
            raise errors.Conflict(f"cluster '{name}' is being deleted")
        if not view.suspended:
            return view
        self.check_capacity(view.spec, excluding=view.uid)
        waits, reason = self.governance.on_create(view.spec, caller) if self.governance is not None else (False, "")
        self.store.set_suspended(view.uid, False)
        if waits:
            self.store.set_queued(view.uid, True, reason)
            message = f"{caller.user} resumed it; it waits: {reason}"
            self.store.record(view, state.EventType.NORMAL, "ResumeQueued", message)
        else:
            self.store.set_queued(view.uid, False, reason)
            self.store.record(view, state.EventType.NORMAL, "Resumed", f"{caller.user} resumed it")
        self.wake(view.uid)
        return self.store.get(namespace, name)

    def delete(self, caller: Principal, namespace: str, name: str) -> state.ClusterView:
        """Ask the loop to stop every node of the cluster and forget it. Deleting twice is harmless.

        Raises:
            NotFound, Forbidden.
        """
        view = self.get(caller, namespace, name, Verb.OPERATE)
        if not view.deleting:
            self.store.mark_deleting(view.uid)
            self.store.record(view, state.EventType.NORMAL, "DeletionRequested", "stopping all nodes")
        self.wake(view.uid)
        return self.store.get(namespace, name)

    def node_action(self, caller: Principal, namespace: str, name: str, node: str, action: str) -> state.ClusterView:
        """``replace``: drain (if it answers) and replace the node, in either recovery mode, even past the
        flapping guard. ``cordon``: hold the node out of automatic recovery; ``uncordon``: release it.

        Raises:
            NotFound: unknown cluster or node. Conflict: the cluster is being deleted. InvalidSpec: unknown action.
        """
        view = self.get(caller, namespace, name, Verb.OPERATE)
        if view.deleting:
            raise errors.Conflict(f"cluster '{name}' is being deleted")
        known = [n.name for n in view.spec.desired_nodes()]
        if node not in known:
            raise errors.NotFound(f"node '{node}' not in cluster '{name}' (nodes: {', '.join(known)})")
        if action == "replace":
            self.store.request_node(view.uid, node, store.REPLACE, caller.user)
            reason, message = "NodeReplaceRequested", f"{caller.user} asked to replace node {node}"
        elif action == "cordon":
            self.store.request_node(view.uid, node, store.CORDON, caller.user)
            reason, message = "NodeCordoned", f"{caller.user} cordoned node {node}: no automatic recovery"
        elif action == "uncordon":
            self.store.clear_node_request(view.uid, node, store.CORDON)
            reason, message = "NodeUncordoned", f"{caller.user} uncordoned node {node}"
        else:
            raise errors.InvalidSpec(f"unknown node action '{action}' (replace, cordon, uncordon)")
        self.store.record(view, state.EventType.NORMAL, reason, message, node)
        self.wake(view.uid)
        return self.store.get(namespace, name)

    def events(self, caller: Principal, namespace: str, name: str, limit: int = 200) -> builtins.list[state.Event]:
        """Events of a cluster, also after it was deleted.

        Raises:
            NotFound: no cluster of that name exists or ever existed. Forbidden.
        """
        self.authorize(caller, Verb.VIEW, namespace)
        found = self.store.events(namespace, name, limit)
        if not found:
            self.store.get(namespace, name)
        return found

    def search_events(
        self, caller: Principal, where: store.EventFilter, limit: int = 200
    ) -> builtins.list[state.Event]:
        """Events across the clusters the caller may view, newest ``limit``, oldest first.

        Raises:
            Forbidden: a namespace in ``where`` the caller may not view.
        """
        for namespace in where.namespaces or ():
            self.authorize(caller, Verb.VIEW, namespace)
        if where.namespaces is None and not caller.is_admin:
            visible = {ns.name for ns in self.identities.list_namespaces() if ns.team in caller.teams}
            where = dataclasses.replace(where, namespaces=frozenset(visible))
        return self.store.search_events(where, limit)


def _summary(spec: spec_mod.ClusterSpec) -> str:
    groups = ", ".join(f"{g.name} x{g.replicas}" for g in spec.worker_groups) or "no workers"
    return f"1 head + worker groups: {groups}"
