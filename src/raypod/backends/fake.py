"""An in-memory backend for tests of the control plane, server and CLI that need no Ray processes.

Nodes start in ``Starting`` and become ``Running`` on the next observation, like a fast real backend.
"""

from __future__ import annotations

import json
import shutil
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from raypod import errors, state
from raypod import spec as spec_mod
from raypod.backends import base, ray_jobs
from raypod.backends.commands import CommandResult, run_command


class FakeBackend(base.NodesFollowActions):
    def __init__(
        self,
        capacity: base.HostCapacity | None = None,
        features: frozenset[base.Feature] = frozenset(
            {
                base.Feature.DRAIN,
                base.Feature.NODE_COMMANDS,
                base.Feature.SPACES,
                base.Feature.HANGWATCH,
                base.Feature.SHARED_ADDON_DIRS,
            }
        ),
    ) -> None:
        self.features = features
        self.tenancy = base.Tenancy(isolated=False, summary="in-memory backend for tests: nothing runs")
        self._capacity = capacity or base.HostCapacity(
            cpus_per_node=8, memory_bytes=64 * 2**30, shared_memory_bytes=32 * 2**30, gpus_per_node=0
        )
        self._lock = threading.Lock()
        self.nodes: dict[str, dict[str, state.ObservedNode]] = {}
        self.calls: list[tuple[Any, ...]] = []
        self.packages: dict[str, set[str]] = {}  # cluster id -> gcs:// packages its (emulated) GCS holds
        self.fail_next_create: str | None = None
        self.no_capacity: set[str] = set()  # node names whose every create fails, as on a full host
        self.held_starting: set[str] = set()  # node names that stay Starting until removed from this set
        self.unreachable: set[str] = set()  # clusters whose GCS does not answer (see ``set_gcs_reachable``)
        self.ray_jobs: dict[str, dict[str, dict[str, Any]]] = {}
        # Set: Ray's job API answers each submission with it, status refused_status.
        self.refused_submission: str | None = None
        self.refused_status = 400
        self.quarantined: list[tuple[str, str, float]] = []  # (cluster, node, seconds) of each replaced node
        self._incarnations = 0
        # Per cluster, node -> a directory a test fills as a node's hangwatch agent would (no agent runs here).
        self.addon_roots: dict[str, dict[str, Path]] = {}
        self.resource_states: dict[str, bytes] = {}  # cluster id -> what ``resource_state`` answers
        self.resource_state_error: Exception | None = None
        self.actors: dict[str, list[dict[str, Any]]] = {}  # cluster id -> live actors its Ray's state API lists
        self.sidecar_endpoints: dict[str, dict[str, str]] = {}  # cluster id -> endpoints its sidecars would answer at
        self.live_tasks: dict[str, list[dict[str, Any]]] = {}  # cluster id -> tasks not ended, as that API lists them
        self._job_http = httpx.Client(transport=httpx.MockTransport(self._answer_job_api))
        self._listener: Callable[[str], None] = lambda cluster_id: None

    def capacity(self) -> base.HostCapacity:
        return self._capacity

    def set_change_listener(self, listener: Callable[[str], None]) -> None:
        self._listener = listener

    def observe(self, cluster_id: str) -> state.ObservedCluster:
        with self._lock:
            nodes = self.nodes.get(cluster_id, {})
            if cluster_id in self.unreachable:
                unknown = {
                    name: _replace(node, phase=state.NodePhase.UNKNOWN, reason="the GCS does not answer")
                    if node.phase is not state.NodePhase.DEAD
                    else node
                    for name, node in nodes.items()
                }
                return state.ObservedCluster(
                    nodes=unknown,
                    endpoints={"dashboard": f"http://fake/{cluster_id}"} if nodes else {},
                    gcs_reachable=False,
                    gcs_error="injected: the GCS does not answer",
                )
            for name, node in list(nodes.items()):
                if node.phase is state.NodePhase.STARTING and name not in self.held_starting:
                    nodes[name] = _replace(
                        node,
                        phase=state.NodePhase.RUNNING,
                        ray_node_id=fake_ray_node_id(name),
                        metrics_endpoint=f"{cluster_id[:8]}-{name}.fake:8080",  # nothing listens: for discovery tests
                    )
                elif node.phase is state.NodePhase.DRAINING:
                    nodes[name] = _replace(node, phase=state.NodePhase.DEAD, reason="drained")
            endpoints = {"dashboard": f"http://fake/{cluster_id}", **self.sidecar_endpoints.get(cluster_id, {})}
            return state.ObservedCluster(nodes=dict(nodes), endpoints=endpoints if nodes else {})

    def create_node(self, cluster_id: str, node: spec_mod.NodeSpec) -> None:
        with self._lock:
            if self.fail_next_create == node.name:
                self.fail_next_create = None
                raise errors.TransientError(f"injected failure creating {node.name}")
            if node.name in self.no_capacity:
                self.calls.append(("create-refused", cluster_id, node.name))
                raise errors.TransientError(f"not enough free memory to start node {node.name}")
            self.calls.append(("create", cluster_id, node.name))
            self._incarnations += 1
            self.nodes.setdefault(cluster_id, {})[node.name] = state.ObservedNode(
                name=node.name,
                group=node.group,
                is_head=node.is_head,
                phase=state.NodePhase.STARTING,
                started_at=time.time(),
                incarnation=f"i{self._incarnations}",
                sidecars=dict.fromkeys(node.sidecars(), state.SidecarState.NOT_STARTED),
            )

    def drain_node(self, cluster_id: str, name: str, ray_node_id: str, deadline: float, reason: str) -> None:
        with self._lock:
            self.calls.append(("drain", cluster_id, name))
            node = self.nodes.get(cluster_id, {}).get(name)
            if node:
                self.nodes[cluster_id][name] = _replace(node, phase=state.NodePhase.DRAINING, drain_deadline=deadline)

    def resource_state(self, cluster_id: str) -> bytes | None:
        """What a test set in ``resource_states`` (Ray's ``ClusterResourceState``, serialized); raises what a test set
        in ``resource_state_error``, as a GCS that does not answer."""
        with self._lock:
            self.calls.append(("resource_state", cluster_id))
            if self.resource_state_error is not None:
                raise self.resource_state_error
            return self.resource_states.get(cluster_id)

    def put_cluster_kv(self, cluster_id: str, namespace: bytes, key: bytes, value: bytes) -> None:
        with self._lock:
            self.calls.append(("put_cluster_kv", cluster_id, namespace, key, value))

    def start_sidecar(self, cluster_id: str, node: str, sidecar: str) -> None:
        with self._lock:
            self.calls.append(("start_sidecar", cluster_id, node, sidecar))
            found = self.nodes.get(cluster_id, {}).get(node)
            if found is None or sidecar not in found.sidecars:
                raise errors.PermanentError(f"node {node} has no sidecar {sidecar}")
            running = {**found.sidecars, sidecar: state.SidecarState.RUNNING}
            self.nodes[cluster_id][node] = _replace(found, sidecars=running)

    def delete_node(self, cluster_id: str, name: str, *, quarantine_s: float = 0.0) -> None:
        with self._lock:
            self.calls.append(("delete", cluster_id, name))
            self.nodes.get(cluster_id, {}).pop(name, None)
            if name == "head":  # without GCS fault tolerance the GCS goes with its head, and what it held
                self.packages.pop(cluster_id, None)
            if quarantine_s:
                self.quarantined.append((cluster_id, name, quarantine_s))

    def run_on_node(self, cluster_id: str, name: str, command: str, timeout_s: float) -> CommandResult:
        """Runs the command for real, on this host, with the node's name in ``RAYPOD_NODE_NAME``, as on a real node."""
        with self._lock:
            if name not in self.nodes.get(cluster_id, {}):
                raise errors.NotFound(f"no node {name}")
        return run_command(
            ["/bin/sh", "-c", command], timeout_s=timeout_s, env={"RAYPOD_NODE_NAME": name, "PATH": "/usr/bin:/bin"}
        )

    def set_gcs_reachable(self, cluster_id: str, reachable: bool) -> None:
        """Simulate a GCS that stops (or starts again) answering while every node process lives."""
        with self._lock:
            (self.unreachable.discard if reachable else self.unreachable.add)(cluster_id)
        self._listener(cluster_id)

    def kill(self, cluster_id: str, name: str) -> None:
        """Simulate a node dying on its own."""
        with self._lock:
            node = self.nodes[cluster_id][name]
            self.nodes[cluster_id][name] = _replace(node, phase=state.NodePhase.DEAD, reason="killed")
        self._listener(cluster_id)

    def addon_dirs(self, cluster_id: str) -> dict[str, Path]:
        return dict(self.addon_roots.get(cluster_id, {}))

    def delete_bind(self, cluster_id: str, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def hidden_from_nodes(self, cluster_id: str, path: str) -> str | None:
        return None

    def sidecar_token(self, cluster_id: str, node: str, sidecar: str) -> str:
        return f"fake-{sidecar}-token-{cluster_id}-{node}"

    def kv_store(self, cluster_id: str, max_bytes: int) -> str:
        raise errors.InvalidSpec("the fake backend runs no Redis: give the KV cache an L2 address")

    def release(self, cluster_id: str) -> None:
        with self._lock:
            self.calls.append(("release", cluster_id, ""))
            self.nodes.pop(cluster_id, None)

    def upstream_tls(self, cluster_id: str) -> ssl.SSLContext | None:
        return None

    def dashboard_headers(self, cluster_id: str) -> dict[str, str]:
        return {}

    def job_api(self, cluster_id: str, dashboard_url: str) -> ray_jobs.RayJobApi:
        return ray_jobs.RayJobApi(dashboard_url, {}, self._job_http)

    def ray_submit(self, cluster_id: str, submission_id: str, entrypoint: str, **extra: object) -> None:
        """A job submitted with plain Ray tooling, straight to the cluster (no raypod metadata)."""
        with self._lock:
            self.ray_jobs.setdefault(cluster_id, {})[submission_id] = {
                "submission_id": submission_id,
                "entrypoint": entrypoint,
                "status": "RUNNING",
                "metadata": {},
                **extra,
            }

    def finish_job(self, cluster_id: str, submission_id: str, status: str) -> None:
        with self._lock:
            self.ray_jobs[cluster_id][submission_id]["status"] = status

    def _answer_job_api(self, request: httpx.Request) -> httpx.Response:
        """An in-memory stand-in for Ray's job REST API on ``http://fake/<cluster id>``."""
        _, cluster_id, *rest = request.url.path.split("/")
        path = "/".join(rest)
        with self._lock:
            found = self.ray_jobs.setdefault(cluster_id, {})
            if path.startswith("api/packages/gcs/"):
                held = self.packages.setdefault(cluster_id, set())
                name = path.removeprefix("api/packages/gcs/")
                if request.method == "PUT":
                    held.add(name)
                    return httpx.Response(200, json={})
                return httpx.Response(200 if name in held else 404, text="")
            if path == "api/jobs/" and request.method == "POST":
                if self.refused_submission is not None:
                    return httpx.Response(self.refused_status, text=self.refused_submission)
                body = json.loads(request.content)
                found[body["submission_id"]] = {
                    **body,
                    "status": "RUNNING",
                    "metadata": body.get("metadata") or {},
                    "job_id": f"{len(found) + 1:02x}000000",
                }
                return httpx.Response(200, json={"submission_id": body["submission_id"]})
            if path == "api/jobs/":
                return httpx.Response(200, json=list(found.values()))
            if path in ("api/v0/tasks/summarize", "api/v0/actors/summarize"):
                kind = path.split("/")[2]
                return httpx.Response(200, json={"data": {"result": {"total": 0, "kind": kind}}})
            if path == "api/v0/tasks":
                unfinished = request.url.params.get_list("filter_predicates") == ["!=", "!="]
                tasks = self.live_tasks.get(cluster_id, []) if unfinished else []
                return httpx.Response(200, json={"data": {"result": {"result": tasks}}})
            if path == "api/v0/placement_groups":
                return httpx.Response(200, json={"data": {"result": {"result": []}}})
            if path == "api/v0/actors":
                actors = self.actors.get(cluster_id, [])
                return httpx.Response(200, json={"data": {"result": {"result": actors}}})
            parts = path.removeprefix("api/jobs/").split("/")
            job = found.get(parts[0])
            if job is None:
                return httpx.Response(404, text="no such job")
            if parts[1:] == ["stop"]:
                job["status"] = "STOPPED"
                return httpx.Response(200, json={"stopped": True})
            if parts[1:] == ["logs"]:
                return httpx.Response(200, json={"logs": f"logs of {parts[0]}\n"})
            return httpx.Response(200, json=job)

    def close(self) -> None:
        self._job_http.close()


def _replace(node: state.ObservedNode, **changes: object) -> state.ObservedNode:
    from dataclasses import replace

    return replace(node, **changes)  # type: ignore[arg-type]


def fake_ray_node_id(node: str) -> str:
    """The Ray node id the fake backend gives a node: 28 bytes in hex, as a GCS gives them (a test that plays the
    GCS's resource state names nodes the same)."""
    return node.encode()[:28].ljust(28, b"\0").hex()
