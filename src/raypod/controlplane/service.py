"""The verbs the API calls: create, get, list, scale, delete, events. Validates, persists and wakes the loop;
the loop makes it true."""

from __future__ import annotations

import builtins
from collections.abc import Callable

from raypod import errors, state
from raypod import spec as spec_mod
from raypod.backends import base
from raypod.controlplane import capacity, store


class ClusterService:
    def __init__(self, db: store.Store, backend: base.Backend, wake: Callable[[], None] = lambda: None) -> None:
        self.store = db
        self.backend = backend
        self.wake = wake

    def create(self, spec: spec_mod.ClusterSpec) -> state.ClusterView:
        """Admit a cluster; nothing starts unless every check passes.

        Raises:
            InvalidSpec, InsufficientCapacity, AlreadyExists.
        """
        capacity.check_features(spec, self.backend.features)
        others = [
            view.spec
            for view in self.store.list()
            if (view.spec.namespace, view.spec.name) != (spec.namespace, spec.name)
        ]
        capacity.check_capacity(spec, others, self.backend.capacity())
        view = self.store.insert(spec)
        self._event(view, state.EventType.NORMAL, "Created", _summary(spec))
        self.wake()
        return view

    def get(self, namespace: str, name: str) -> state.ClusterView:
        return self.store.get(namespace, name)

    def list(self, namespace: str | None = None) -> list[state.ClusterView]:
        return self.store.list(namespace)

    def scale(self, namespace: str, name: str, group: str, replicas: int) -> state.ClusterView:
        """Set one worker group's replicas; running nodes removed by a scale-down are drained first.

        Raises:
            NotFound: unknown cluster or group. InvalidSpec: replicas out of bounds.
            Conflict: the cluster is being deleted. InsufficientCapacity.
        """
        view = self.store.get(namespace, name)
        if view.deleting:
            raise errors.Conflict(f"cluster '{name}' is being deleted; it cannot be scaled")
        before = view.spec.group(group).replicas
        scaled = view.spec.with_replicas(group, replicas)
        if replicas > before:
            others = [v.spec for v in self.store.list() if v.uid != view.uid]
            capacity.check_capacity(scaled, others, self.backend.capacity())
        self.store.update_spec(view.uid, scaled)
        self._event(view, state.EventType.NORMAL, "Scaled", f"worker group {group}: {before} -> {replicas} replicas")
        self.wake()
        return self.store.get(namespace, name)

    def delete(self, namespace: str, name: str) -> state.ClusterView:
        """Ask the loop to stop every node of the cluster and forget it. Deleting twice is harmless.

        Raises:
            NotFound.
        """
        view = self.store.get(namespace, name)
        if not view.deleting:
            self.store.mark_deleting(view.uid)
            self._event(view, state.EventType.NORMAL, "DeletionRequested", "stopping all nodes")
        self.wake()
        return self.store.get(namespace, name)

    def events(self, namespace: str, name: str, limit: int = 200) -> builtins.list[state.Event]:
        """Events of a cluster, also after it was deleted.

        Raises:
            NotFound: no cluster of that name exists or ever existed.
        """
        found = self.store.events(namespace, name, limit)
        if not found:
            self.store.get(namespace, name)
        return found

    def _event(self, view: state.ClusterView, kind: state.EventType, reason: str, message: str) -> None:
        self.store.add_event(
            view.uid,
            state.Event(
                time=store.now(),
                namespace=view.spec.namespace,
                cluster=view.spec.name,
                type=kind,
                reason=reason,
                message=message,
            ),
        )


def _summary(spec: spec_mod.ClusterSpec) -> str:
    groups = ", ".join(f"{g.name} x{g.replicas}" for g in spec.worker_groups) or "no workers"
    return f"1 head + worker groups: {groups}"
