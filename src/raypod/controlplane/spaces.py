"""Workspace verbs: create, list, get, stop, start, move, delete. A workspace lives in its cluster's spec
(``ClusterSpec.spaces``); the reconcile loop runs its node like any other, and the backend its IDE."""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from pathlib import Path

from raypod import errors, state
from raypod import spec as spec_mod
from raypod.capabilities.spaces import ide
from raypod.controlplane import capacity, identity, store
from raypod.controlplane.clusters import ClusterService
from raypod.state import SpaceState

Verb = identity.Verb


@dataclass(frozen=True)
class Upstream:
    """How the gateway reaches a workspace's IDE, and whose it is (the gateway asks ``may_open``)."""

    view: state.ClusterView  # its cluster's
    space: spec_mod.SpaceSpec
    token: str  # the IDE's own secret, which the gateway presents and users never see
    team: str | None


class SpaceService:
    def __init__(self, clusters: ClusterService, home: Path) -> None:
        self.clusters = clusters
        self.home = home

    def create(
        self, caller: identity.Principal, namespace: str, cluster: str, space: spec_mod.SpaceSpec
    ) -> state.SpaceView:
        """Raises NotFound (cluster), AlreadyExists (a workspace of that name in the namespace), InvalidSpec (the
        IDE is not installed), Conflict (the cluster is being deleted), InsufficientCapacity."""
        view = self.clusters.get(caller, namespace, cluster, Verb.OPERATE)
        if view.deleting:
            raise errors.Conflict(f"cluster '{cluster}' is being deleted")
        space = self.clusters.admit_spaces(
            caller, namespace, view.spec.model_copy(update={"spaces": [space]}), [space]
        ).spaces[0]
        if self.clusters.store.files_being_deleted(str(ide.files_dir(self.home, namespace, space.name, space.owner))):
            raise errors.Conflict(f"the files of workspace '{space.name}' are being deleted: create it again shortly")
        why = ide.missing(space.kind)
        if space.python_env and why is None:
            why = self._python_env_problem(view, space)
        if why:
            raise errors.InvalidSpec(f"cannot create workspace '{space.name}': {why}")
        self._update(view, [*view.spec.spaces, space], "SpaceCreated", f"workspace {space.name} ({space.kind.value})")
        return self.get(caller, namespace, space.name)

    def list(self, caller: identity.Principal, namespace: str | None = None) -> builtins.list[state.SpaceView]:
        """Raises Forbidden for a namespace the caller may not view (as for its clusters)."""
        if namespace is not None:
            self.clusters.authorize(caller, Verb.VIEW, namespace)
        return [
            _view(cluster, space)
            for cluster in self.clusters.list(caller, namespace)
            for space in cluster.spec.spaces
            if may_open(caller, self.clusters.identities.namespace_team(cluster.spec.namespace), space.owner)
        ]

    def get(self, caller: identity.Principal, namespace: str, name: str) -> state.SpaceView:
        cluster, space = self._owned(caller, namespace, name, Verb.VIEW)
        return _view(cluster, space)

    def set_running(self, caller: identity.Principal, namespace: str, name: str, running: bool) -> state.SpaceView:
        """Stop (its node goes, its files stay) or start a workspace."""
        cluster, space = self._owned(caller, namespace, name, Verb.OPERATE)
        if space.running != running:
            spaces = [s.model_copy(update={"running": running}) if s.name == name else s for s in cluster.spec.spaces]
            reason = "SpaceStarted" if running else "SpaceStopped"
            self._update(cluster, spaces, reason, f"workspace {name}")
        return self.get(caller, namespace, name)

    def move(self, caller: identity.Principal, namespace: str, name: str, target: str) -> state.SpaceView:
        """To another cluster of the namespace; its files go with it (they are not the cluster's)."""
        cluster, space = self._owned(caller, namespace, name, Verb.OPERATE)
        if target == cluster.spec.name:
            return _view(cluster, space)
        destination = self.clusters.get(caller, namespace, target, Verb.OPERATE)
        if destination.deleting:
            raise errors.Conflict(f"cluster '{target}' is being deleted")
        self._update(
            destination, [*destination.spec.spaces, space], "SpaceMoved", f"workspace {name} from {cluster.spec.name}"
        )
        self._update(
            cluster, [s for s in cluster.spec.spaces if s.name != name], "SpaceMoved", f"workspace {name} to {target}"
        )
        return self.get(caller, namespace, name)

    def delete(self, caller: identity.Principal, namespace: str, name: str, keep_files: bool = True) -> state.SpaceView:
        """With ``keep_files`` False the loop deletes its files once its node is gone (never while it may run)."""
        cluster, space = self._owned(caller, namespace, name, Verb.OPERATE)
        kept = "its files are kept" if keep_files else "its files are deleted once its node is gone"
        spaces = [s for s in cluster.spec.spaces if s.name != name]
        self._update(cluster, spaces, "SpaceDeleted", f"workspace {name}; {kept}")
        if not keep_files:  # after: a request for a node still wanted would take the files at its next stop
            files = str(ide.files_dir(self.home, namespace, name, space.owner))
            self.clusters.store.request_node(cluster.uid, space.node_name(), store.DELETE_FILES, caller.user, files)
            self.clusters.wake(cluster.uid)
        return _view(cluster, space).model_copy(update={"state": SpaceState.DELETED})

    def upstream(self, namespace: str, name: str) -> Upstream:
        """For the gateway, which decides who may open it before anything it proxies. Raises NotFound."""
        view = self._find(namespace, name)
        space = view.spec.space(name) if view else None
        if view is None or space is None:
            raise errors.NotFound(f"workspace '{name}' not found in namespace '{namespace}'")
        token = self.clusters.backend.sidecar_token(view.uid, space.node_name(), spec_mod.IDE_SIDECAR)
        return Upstream(view, space, token, self.clusters.identities.namespace_team(namespace))

    # -- internals ---------------------------------------------------------------------------------------

    def _python_env_problem(self, view: state.ClusterView, space: spec_mod.SpaceSpec) -> str | None:
        assert space.python_env is not None
        if space.kind is not spec_mod.SpaceKind.JUPYTERLAB:
            return "python_env: only JupyterLab's kernels run in an environment of their own"
        hidden = self.clusters.backend.hidden_from_nodes(view.uid, space.python_env)
        if hidden:
            return f"python_env: the cluster's nodes cannot read {space.python_env} ({hidden})"
        return ide.python_env_problem(space.python_env, view.spec.ray_version)

    def _find(self, namespace: str, name: str) -> state.ClusterView | None:
        return next((view for view in self.clusters.store.list(namespace) if view.spec.space(name)), None)

    def _owned(
        self, caller: identity.Principal, namespace: str, name: str, verb: Verb
    ) -> tuple[state.ClusterView, spec_mod.SpaceSpec]:
        """A workspace the caller may see (others answer NotFound, as an absent one), and use with ``verb``."""
        self.clusters.authorize(caller, Verb.VIEW, namespace)
        cluster = self._find(namespace, name)
        space = cluster.spec.space(name) if cluster else None
        team = self.clusters.identities.namespace_team(namespace)
        if cluster is None or space is None or not may_open(caller, team, space.owner):
            raise errors.NotFound(f"workspace '{name}' not found in namespace '{namespace}'")
        if verb is not Verb.VIEW:
            self.clusters.authorize(caller, verb, namespace, space.owner)
        return cluster, space

    def _update(
        self, view: state.ClusterView, spaces: builtins.list[spec_mod.SpaceSpec], reason: str, message: str
    ) -> None:
        spec = spec_mod.parse_spec(
            {**view.spec.model_dump(mode="json"), "spaces": [s.model_dump(mode="json") for s in spaces]}
        )
        capacity.check_features(spec, self.clusters.backend.features)
        if len(spec.desired_nodes()) > len(view.spec.desired_nodes()):
            self.clusters.check_capacity(spec, excluding=view.uid)
        self.clusters.store.update_spec(view.uid, spec)
        self.clusters.store.record(view, state.EventType.NORMAL, reason, message)
        self.clusters.wake(view.uid)


def may_open(caller: identity.Principal, team: str | None, owner: str | None) -> bool:
    """A workspace runs its user's code with their files: its owner and admins may see it, no one else."""
    if caller.is_admin or (owner is not None and owner == caller.user):
        return True
    return team is not None and caller.teams.get(team) is state.Role.ADMIN


def _view(cluster: state.ClusterView, space: spec_mod.SpaceSpec) -> state.SpaceView:
    node = space.node_name()
    url = f"/spaces/{cluster.spec.namespace}/{space.name}/"
    base = dict(
        name=space.name,
        namespace=cluster.spec.namespace,
        cluster=cluster.spec.name,
        kind=space.kind.value,
        owner=space.owner,
        url=url,
        node=node,
        python_env=space.python_env,
    )
    if not space.running:
        return state.SpaceView(**base, state=SpaceState.STOPPED, message="stopped: its files are kept")
    if cluster.status.observed_generation < cluster.generation:
        # The status predates the last change (a stop then a start, a move): its node may be on its way out.
        return state.SpaceView(
            **base, state=SpaceState.STARTING, message="the control plane has not applied the change yet"
        )
    observed = next((n for n in cluster.status.nodes if n.name == node), None)
    answers = bool(cluster.status.endpoints.get(f"space/{space.name}"))
    # Ready means a notebook's first ray.init() connects at once: the IDE answers and its node is in the cluster.
    if answers and observed is not None and observed.phase is state.NodePhase.RUNNING:
        return state.SpaceView(**base, state=SpaceState.READY)
    message = f"node {node} is {observed.phase.value}" if observed else f"node {node} is not started yet"
    if answers:
        message += "; the IDE answers"
    return state.SpaceView(**base, state=SpaceState.STARTING, message=message)
