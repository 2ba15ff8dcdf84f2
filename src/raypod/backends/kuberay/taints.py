"""Quarantine of bad Kubernetes nodes: once raypod's pods on one node were replaced BAD_NODE_FAILURES times within
the quarantine, the node is tainted ``NoSchedule`` until the quarantine ends (KubeRay's replacement goes elsewhere).

The taints live on the nodes, so they outlive a restart of raypod; where raypod may not read nodes (a Role-only
install) nodes are never tainted.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from raypod.backends.kuberay import api_errors

log = logging.getLogger(__name__)

QUARANTINE_TAINT = "raypod.io/quarantined"  # value: the Unix time it is lifted; effect NoSchedule
TAINT_CHECK_S = 5.0
BAD_NODE_FAILURES = 2  # replacements of raypod pods on one Kubernetes node, within the quarantine, that taint it


class NodeQuarantine:
    def __init__(self, core: client.CoreV1Api, request_timeout_s: float) -> None:
        self._core = core
        self._timeout = request_timeout_s
        self._lock = threading.Lock()
        self._replaced_on: dict[str, list[float]] = {}  # Kubernetes node -> when raypod's pods there were replaced
        self._taints: dict[str, float] | None = None  # Kubernetes node -> when raypod's taint on it is lifted
        self._taints_checked = 0.0

    def count_failure(self, host: str, quarantine_s: float) -> None:
        """A replaced pod's Kubernetes node: once raypod's pods there were replaced BAD_NODE_FAILURES times within
        the quarantine, the node itself is taken to be bad, and tainted so that no new pod lands there until the
        quarantine ends (KubeRay's replacement goes elsewhere). One failing pod never taints a shared node."""
        now = time.time()
        with self._lock:
            recent = [t for t in self._replaced_on.get(host, []) if now - t < quarantine_s] + [now]
            self._replaced_on[host] = recent
        if len(recent) < BAD_NODE_FAILURES or self._known_taints() is None:
            return
        until = now + quarantine_s
        try:
            node = self._core.read_node(host, _request_timeout=self._timeout)
            taints = [t for t in _taints_of(node) if t.key != QUARANTINE_TAINT]
            mine = client.V1Taint(key=QUARANTINE_TAINT, value=str(int(until)), effect="NoSchedule")
            self._patch_taints(host, node, [*taints, mine])
        except Exception as exc:  # a taint is a precaution: the pod is replaced either way
            log.warning("%s", api_errors.explain(exc, f"taint Kubernetes node {host}"))
            return
        with self._lock:
            assert self._taints is not None
            self._taints[host] = until
        log.warning(
            "Kubernetes node %s: %d of raypod's pods there were replaced within %.0f s; tainted %s:NoSchedule until %s",
            host,
            len(recent),
            quarantine_s,
            QUARANTINE_TAINT,
            datetime.fromtimestamp(until).isoformat(timespec="seconds"),
        )

    def _known_taints(self) -> dict[str, float] | None:
        """raypod's taints by node, read from the nodes once (they outlive a restart of raypod); None where raypod
        may not read nodes (a Role-only install): then nodes are never tainted."""
        if self._taints is None:
            try:
                nodes = self._core.list_node(_request_timeout=self._timeout).items
            except Exception as exc:
                log.warning("%s; bad nodes are not tainted", api_errors.explain(exc, "list Kubernetes nodes"))
                self._taints_checked = float("inf")
                return None
            self._taints = {
                str(node.metadata.name if node.metadata else ""): float(taint.value or 0)
                for node in nodes
                for taint in _taints_of(node)
                if taint.key == QUARANTINE_TAINT
            }
        return self._taints

    def lift_expired(self) -> None:
        """At most every few seconds, from the loop's observations: remove raypod's taints whose time is up."""
        now = time.time()
        if now - self._taints_checked < TAINT_CHECK_S:
            return
        self._taints_checked = now
        taints = self._known_taints()
        if taints is None:
            return
        with self._lock:
            due = [host for host, until in taints.items() if until <= now]
        for host in due:
            try:
                node = self._core.read_node(host, _request_timeout=self._timeout)
                kept = [t for t in _taints_of(node) if t.key != QUARANTINE_TAINT]
                self._patch_taints(host, node, kept)
            except ApiException as exc:
                if exc.status != 404:
                    log.warning("%s", api_errors.explain(exc, f"lift the taint of Kubernetes node {host}"))
                    continue
            except Exception as exc:
                log.warning("%s", api_errors.explain(exc, f"lift the taint of Kubernetes node {host}"))
                continue
            with self._lock:
                taints.pop(host, None)
            log.info("Kubernetes node %s: raypod's quarantine ended; taint %s removed", host, QUARANTINE_TAINT)

    def _patch_taints(self, host: str, node: client.V1Node, taints: list[client.V1Taint]) -> None:
        """The node's whole taint list, conditional on the version read (a 409 leaves it for the next try)."""
        version = node.metadata.resource_version if node.metadata else None
        written = [{"key": t.key, "value": t.value, "effect": t.effect} for t in taints]
        body = {"metadata": {"resourceVersion": version}, "spec": {"taints": written}}
        self._core.patch_node(host, body, _request_timeout=self._timeout)


def _taints_of(node: client.V1Node) -> list[client.V1Taint]:
    return list((node.spec.taints if node.spec else None) or [])
