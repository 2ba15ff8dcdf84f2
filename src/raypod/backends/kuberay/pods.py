"""raypod's view of KubeRay's pods: node names (``head``, ``<group>-<i>`` by age) and each node's phase."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

from raypod import spec as spec_mod
from raypod import state

METRICS_PORT = 8080
SPACE_PREFIX = f"{spec_mod.SPACE_GROUP}-"


def pods_by_node(pods: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """raypod's node names for KubeRay's pods: ``head``, and ``<group>-<i>`` by age within each group."""
    named: dict[str, dict[str, Any]] = {}
    groups: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        if is_head(pod):
            named["head"] = pod
        else:
            groups.setdefault(pod["metadata"].get("labels", {}).get("ray.io/group", "workers"), []).append(pod)
    for group, members in sorted(groups.items()):
        ordered = sorted(members, key=lambda p: (p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"]))
        if group.startswith(SPACE_PREFIX):  # a workspace's group of one pod: its node is named as the group
            named[group] = ordered[-1]
            continue
        for index, pod in enumerate(ordered):
            named[f"{group}-{index}"] = pod
    return named


def observed_nodes(pods: list[dict[str, Any]]) -> dict[str, state.ObservedNode]:
    return {name: _observe_pod(name, pod) for name, pod in pods_by_node(pods).items()}


def _observe_pod(name: str, pod: dict[str, Any]) -> state.ObservedNode:
    metadata, status = pod["metadata"], pod.get("status") or {}
    phase, reason = _pod_phase(pod)
    created = metadata.get("creationTimestamp")
    ip = status.get("podIP")
    return state.ObservedNode(
        name=name,
        group="head" if is_head(pod) else metadata.get("labels", {}).get("ray.io/group", ""),
        is_head=is_head(pod),
        phase=phase,
        started_at=datetime.fromisoformat(created.replace("Z", "+00:00")).timestamp() if created else 0.0,
        reason=reason,
        incarnation=metadata.get("uid") or metadata["name"],
        metrics_endpoint=f"{ip}:{METRICS_PORT}" if ip else None,
    )


def _pod_phase(pod: dict[str, Any]) -> tuple[state.NodePhase, str]:
    status = pod.get("status") or {}
    if pod["metadata"].get("deletionTimestamp"):
        return state.NodePhase.DEAD, "its pod is terminating"
    if status.get("reason") == "NodeLost" or status.get("phase") == "Unknown":
        return state.NodePhase.UNKNOWN, "its Kubernetes node does not report (NodeLost)"
    phase = status.get("phase", "Pending")
    if phase in ("Failed", "Succeeded"):
        terminated = [
            c.get("state", {}).get("terminated", {}) for c in status.get("containerStatuses", []) if c.get("state")
        ]
        why = next((t.get("reason") for t in terminated if t.get("reason")), status.get("reason") or phase)
        return state.NodePhase.DEAD, f"its pod {phase.lower()}: {why}"
    conditions = status.get("conditions", [])
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    if phase == "Running" and ready:
        return state.NodePhase.RUNNING, ""
    unscheduled = next((c for c in conditions if c.get("type") == "PodScheduled" and c.get("status") == "False"), None)
    if unscheduled is not None:  # e.g. "0/3 nodes are available: 3 Insufficient cpu.": what a user must change
        why = unscheduled.get("message") or unscheduled.get("reason") or "no Kubernetes node can take it"
        return state.NodePhase.STARTING, f"its pod cannot be scheduled: {why}"
    return state.NodePhase.STARTING, "its pod is " + ("starting" if phase == "Running" else phase.lower())


def is_head(pod: dict[str, Any]) -> bool:
    return bool(pod["metadata"].get("labels", {}).get("ray.io/node-type") == "head")


def unknown(node: state.ObservedNode, reason: str) -> state.ObservedNode:
    return replace(node, phase=state.NodePhase.UNKNOWN, reason=reason)
