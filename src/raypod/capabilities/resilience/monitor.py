"""Runs the probes of every node once per reconcile pass and keeps each node's health between passes.

Probes of one pass run concurrently and are each bounded (a frozen node costs one probe timeout, not one per
signal); user health checks run in the background at their own period and are read when they finish, so a slow
check never holds up a pass. Health belongs to one incarnation of a node: a replacement starts afresh.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import psutil

from raypod import spec as spec_mod
from raypod import state
from raypod.backends import base
from raypod.backends.commands import CommandResult
from raypod.capabilities.resilience import model, signals
from raypod.capabilities.resilience.gpu import GpuHealth

log = logging.getLogger(__name__)

DISK_THRESHOLD = 3  # low disk: three readings in a row


@dataclass(frozen=True)
class Transition:
    """A node's health changed to a state worth an event (suspect, unhealthy, or healthy again)."""

    node: str
    after: model.NodeHealth


@dataclass
class _Check:
    incarnation: str
    started_at: float
    running: Future[CommandResult] | None = None


class HealthMonitor:
    def __init__(
        self,
        backend: base.Backend,
        *,
        gpus: GpuHealth | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_workers: int = 8,
    ) -> None:
        self.backend = backend
        self.gpus = gpus
        self.clock = clock
        self._http = httpx.Client()
        self._probes = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="raypod-probe")
        self._checks_pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="raypod-check")
        self._lock = threading.Lock()
        # By cluster, then node (and check): a pass over one cluster never walks another's entries.
        self._health: dict[str, dict[str, tuple[str, model.NodeHealth]]] = {}
        self._checks: dict[str, dict[tuple[str, str], _Check]] = {}
        self._host_sample: tuple[float, model.SignalResult] | None = None

    def checks_due(self, view: state.ClusterView) -> bool:
        """A health check of the cluster has finished, or is due to start: a loop that leaves settled clusters
        alone between changes (KubeRay's) looks at this one now all the same."""
        if not view.spec.health_checks:
            return False
        now = self.clock()
        period = min(check.period_s for check in view.spec.health_checks)
        with self._lock:
            entries = list(self._checks.get(view.uid, {}).values())
        return any(
            (e.running is not None and e.running.done()) or (e.running is None and now - e.started_at >= period)
            for e in entries
        )

    def assess(
        self, view: state.ClusterView, observed: state.ObservedCluster
    ) -> tuple[dict[str, model.NodeHealth], list[Transition]]:
        """This pass's health of every observed node, and the transitions since the last pass."""
        policy = view.spec.recovery
        host_memory = self._host_memory()
        # Nodes on their way out (a scale-down, a deletion) are not assessed: their end is not a health event.
        wanted = {} if view.deleting else {node.name: node for node in view.spec.desired_nodes()}
        live = [
            n
            for n in observed.nodes.values()
            if n.phase in (state.NodePhase.RUNNING, state.NodePhase.DRAINING) and n.name in wanted
        ]
        agent_answers = {
            node.name: self._probes.submit(
                signals.probe_agent,
                self._http,
                node.agent_endpoint,
                timeout_s=policy.probe_timeout_s,
                threshold=policy.probe_failure_threshold,
            )
            for node in live
            if node.agent_endpoint
        }
        healths: dict[str, model.NodeHealth] = {}
        transitions: list[Transition] = []
        for node in observed.nodes.values():
            if node.name not in wanted:
                continue
            with self._lock:
                incarnation, previous = self._health.get(view.uid, {}).get(node.name, ("", model.UNASSESSED))
            if incarnation != node.incarnation:
                previous = model.UNASSESSED
            if node.phase is state.NodePhase.UNKNOWN:
                healths[node.name] = model.NodeHealth(state.NodeHealthState.UNKNOWN, previous.signals)
                continue  # nothing observed: the last assessment is kept, unchanged
            if node.phase is state.NodePhase.STARTING:
                current = model.UNASSESSED
            elif node.phase is state.NodePhase.DEAD:
                signal = "process" if "process" in node.reason else "ray"
                dead = model.SignalResult(signal, model.Level.FAIL, node.reason or "node died")
                current = model.assess(previous, [dead], recovery_threshold=policy.recovery_threshold)
            else:
                results = [host_memory, *self._node_signals(policy, node, wanted[node.name])]
                if node.name in agent_answers:
                    results.append(agent_answers[node.name].result())
                results.extend(self._user_checks(view, node))
                current = model.assess(previous, results, recovery_threshold=policy.recovery_threshold)
            with self._lock:
                self._health.setdefault(view.uid, {})[node.name] = (node.incarnation, current)
            healths[node.name] = current
            if _worth_an_event(previous.state, current.state):
                transitions.append(Transition(node.name, current))
        self._forget_nodes(view.uid, set(observed.nodes))
        return healths, transitions

    def _host_memory(self) -> model.SignalResult:
        """The host's memory signal, read at most once a second: a fleet's pass assesses thousands of clusters."""
        now = self.clock()
        if self._host_sample is None or now - self._host_sample[0] >= 1.0:
            host = psutil.virtual_memory()
            self._host_sample = (now, signals.check_host_memory(host.available, host.total))
        return self._host_sample[1]

    def forget(self, cluster_id: str) -> None:
        self._forget_nodes(cluster_id, set())

    def close(self) -> None:
        self._probes.shutdown(wait=False, cancel_futures=True)
        self._checks_pool.shutdown(wait=False, cancel_futures=True)
        self._http.close()

    def _node_signals(
        self, policy: spec_mod.RecoverySpec, node: state.ObservedNode, wanted: spec_mod.NodeSpec
    ) -> list[model.SignalResult]:
        capacity = self.backend.capacity()
        overhead = capacity.head_overhead_bytes if wanted.is_head else capacity.worker_overhead_bytes
        found = [signals.check_memory(node.memory_bytes, wanted.memory + wanted.object_store_memory + overhead)]
        if node.session_dir:
            found.append(signals.check_disk(node.session_dir, min_free=policy.min_free_disk, threshold=DISK_THRESHOLD))
        if wanted.gpus and self.gpus is not None:
            found.append(self.gpus.check(wanted.gpus))
        return found

    def _user_checks(self, view: state.ClusterView, node: state.ObservedNode) -> list[model.SignalResult]:
        """Results of checks that finished since the last pass; starts the ones that are due."""
        found = []
        now = self.clock()
        for check in view.spec.health_checks:
            key = (node.name, check.name)
            with self._lock:
                entry = self._checks.get(view.uid, {}).get(key)
                if entry is not None and entry.incarnation != node.incarnation:
                    entry = None
                if entry is not None and entry.running is not None and entry.running.done():
                    try:
                        result = entry.running.result()
                    except Exception as exc:  # the backend could not run it at all: unknown, not failed
                        log.warning("health check %s on %s could not run: %s", check.name, node.name, exc)
                    else:
                        found.append(
                            signals.command_signal(
                                result, check.name, timeout_s=check.timeout_s, threshold=check.failure_threshold
                            )
                        )
                    entry.running = None
                if entry is None or (entry.running is None and now - entry.started_at >= check.period_s):
                    running = self._checks_pool.submit(
                        self.backend.run_on_node, view.uid, node.name, check.command, check.timeout_s
                    )
                    self._checks.setdefault(view.uid, {})[key] = _Check(node.incarnation, now, running)
        return found

    def _forget_nodes(self, cluster_id: str, keep: set[str]) -> None:
        with self._lock:
            health = self._health.get(cluster_id, {})
            for node in [n for n in health if n not in keep]:
                del health[node]
            checks = self._checks.get(cluster_id, {})
            for key in [k for k in checks if k[0] not in keep]:
                del checks[key]
            if not keep:
                self._health.pop(cluster_id, None)
                self._checks.pop(cluster_id, None)


def _worth_an_event(before: state.NodeHealthState, after: state.NodeHealthState) -> bool:
    troubled = (state.NodeHealthState.SUSPECT, state.NodeHealthState.UNHEALTHY)
    if after in troubled:
        return after is not before
    return after is state.NodeHealthState.HEALTHY and before in troubled
