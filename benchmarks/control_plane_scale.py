"""The control plane at fleet scale: 1,000 clusters and 10,000 nodes on the fake backend, with nodes failing and
coming back and users scaling, creating and deleting clusters, against one raypod server process.

- ``reconcile_p50_ms``/``reconcile_p99_ms``: a user's scale call answered -> the backend asked to start or drain the
  node it adds or removes (the server's clock and this one are the same host's).
- ``api_list_p99_ms``: ``GET /api/v1/clusters?limit=100`` (one page), ``api_get_p99_ms``: one cluster, both while
  the fleet churns; ``api_list_all_s``: every cluster, paging through.
- ``store_mb``: the SQLite file; ``server_rss_mb``: the server process's resident memory at the end.
- ``node_failures``/``replaced``: nodes killed by the simulation, and replacements the control plane started.

Usage: python benchmarks/control_plane_scale.py [--clusters 1000] [--nodes 10] [--seconds 60]
Last line: one JSON object. Goals: reconcile_p99_ms < 1000, api_list_p99_ms < 200, server_rss_mb < 1000.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
from _common import percentile

from raypod.testing import free_port

FAILURES_PER_S = 0.5  # 10,000 nodes failing on average every ~5.5 hours each, as on a large, busy fleet
USER_ACTIONS_PER_S = 4.0


def serve(home: Path, port: int) -> None:
    """The server under test: raypod's app on a fake backend with no capacity limit, which logs every action it
    is asked for and kills random running nodes."""
    import uvicorn

    from raypod import config, state
    from raypod.backends import base
    from raypod.backends.fake import FakeBackend
    from raypod.server.app import create_app

    class SimBackend(FakeBackend):
        def __init__(self) -> None:
            # Like the Kubernetes backend's watches, it says when a cluster's observation changed (a kill).
            features = frozenset({base.Feature.DRAIN, base.Feature.CHANGE_EVENTS})
            super().__init__(capacity=base.HostCapacity(None, None, None, None), features=features)
            self.actions = open(home / "actions.jsonl", "a", buffering=1)  # noqa: SIM115

        def _log(self, verb: str, cluster_id: str, name: str) -> None:
            self.actions.write(json.dumps([verb, cluster_id, name, time.time()]) + "\n")

        def create_node(self, cluster_id: str, node: Any) -> None:
            super().create_node(cluster_id, node)
            self._log("create", cluster_id, node.name)

        def drain_node(self, cluster_id: str, name: str, ray_node_id: str, deadline: float, reason: str) -> None:
            super().drain_node(cluster_id, name, ray_node_id, deadline, reason)
            self._log("drain", cluster_id, name)

        def delete_node(self, cluster_id: str, name: str, *, quarantine_s: float = 0.0) -> None:
            super().delete_node(cluster_id, name, quarantine_s=quarantine_s)
            self._log("delete", cluster_id, name)

        def fail_nodes(self, stop: threading.Event) -> None:
            while not stop.wait(random.expovariate(FAILURES_PER_S)):
                with self._lock:
                    running = [
                        (cluster, name)
                        for cluster, nodes in self.nodes.items()
                        for name, node in nodes.items()
                        if node.phase is state.NodePhase.RUNNING and not node.is_head
                    ]
                if running:
                    cluster, name = random.choice(running)
                    self.kill(cluster, name)
                    self._log("kill", cluster, name)

    backend = SimBackend()
    settings = config.Settings(home=home, port=port, tls=False, reconcile_interval_s=1.0)
    stop = threading.Event()
    threading.Thread(target=backend.fail_nodes, args=(stop,), daemon=True).start()
    uvicorn.run(create_app(settings, backend=backend), host="127.0.0.1", port=port, log_level="warning")
    stop.set()


def spec(name: str, workers: int) -> dict[str, Any]:
    return {"name": name, "head": {"cpus": 1}, "worker_groups": [{"name": "w", "replicas": workers, "cpus": 1}]}


def timed(samples: list[float], call: Any) -> httpx.Response:
    started = time.perf_counter()
    response = call()
    samples.append((time.perf_counter() - started) * 1000)
    response.raise_for_status()
    return response


def list_all(http: httpx.Client) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    params: dict[str, Any] = {"limit": 500}
    while True:
        page = http.get("/api/v1/clusters", params=params)
        page.raise_for_status()
        items += page.json()
        token = page.headers.get("x-continue")
        if not token:
            return items
        params = {"limit": 500, "continue": token}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clusters", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=10, help="nodes per cluster, the head included")
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--serve", nargs=2, metavar=("HOME", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(Path(args.serve[0]), int(args.serve[1]))
        return

    home, port = Path(tempfile.mkdtemp(prefix="raypod-scale-")), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAYPOD_")}
    log = open(home / "server.log", "wb")  # noqa: SIM115
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(home), str(port)], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        for _ in range(300):
            if (home / "credentials").exists():
                break
            time.sleep(0.1)
        token = json.loads((home / "credentials").read_text())["token"]
        http = httpx.Client(
            base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"}, timeout=60
        )
        workers = args.nodes - 1
        started = time.perf_counter()
        for index in range(args.clusters):
            http.post("/api/v1/clusters", json=spec(f"c{index:04d}", workers)).raise_for_status()
        created_s = time.perf_counter() - started
        deadline = time.monotonic() + 600
        while True:
            # Degraded counts as settled: a cluster hit by several of the random failures is held by the flapping
            # guard, as it should be.
            ready = sum(1 for view in list_all(http) if view["status"]["phase"] in ("Ready", "Degraded"))
            if ready == args.clusters or time.monotonic() > deadline:
                break
            time.sleep(1)
        all_ready_s = time.perf_counter() - started
        print(
            f"{args.clusters} clusters created in {created_s:.1f} s, {ready} settled after {all_ready_s:.1f} s",
            flush=True,
        )

        stop = threading.Event()
        list_ms: list[float] = []
        get_ms: list[float] = []
        scales: list[tuple[str, str, str, float]] = []  # cluster, verb expected, node, time answered

        def read_api() -> None:
            reader = httpx.Client(base_url=http.base_url, headers=http.headers, timeout=60)
            while not stop.is_set():
                timed(list_ms, lambda: reader.get("/api/v1/clusters", params={"limit": 100}))
                name = f"c{random.randrange(args.clusters):04d}"
                response = reader.get(f"/api/v1/namespaces/default/clusters/{name}")
                if response.status_code != 404:  # deleted by the churn below
                    get_ms.append(response.elapsed.total_seconds() * 1000)
                time.sleep(0.05)

        reader = threading.Thread(target=read_api, daemon=True)
        reader.start()
        replicas = {f"c{index:04d}": workers for index in range(args.clusters)}
        uids = {view["spec"]["name"]: view["uid"] for view in list_all(http)}
        churned = 0
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            time.sleep(random.expovariate(USER_ACTIONS_PER_S))
            name = random.choice(sorted(replicas))
            if random.random() < 0.1:  # a user deletes a cluster and creates another
                http.delete(f"/api/v1/namespaces/default/clusters/{name}").raise_for_status()
                del replicas[name]
                fresh = f"n{churned:04d}"
                churned += 1
                view = http.post("/api/v1/clusters", json=spec(fresh, workers)).json()
                replicas[fresh], uids[fresh] = workers, view["uid"]
                continue
            up = replicas[name] < workers or (replicas[name] == workers and random.random() < 0.5)
            target = replicas[name] + (1 if up else -1)
            response = http.post(
                f"/api/v1/namespaces/default/clusters/{name}/scale", json={"group": "w", "replicas": target}
            )
            response.raise_for_status()
            answered = time.time()
            node = f"w-{target - 1}" if up else f"w-{target}"
            scales.append((uids[name], "create" if up else "drain", node, answered))
            replicas[name] = target
        stop.set()
        reader.join(timeout=60)
        time.sleep(5)  # the last scale calls' actions

        actions: dict[tuple[str, str, str], list[float]] = {}
        counts: dict[str, int] = {}
        for line in (home / "actions.jsonl").read_text().splitlines():
            verb, cluster, node, at = json.loads(line)
            actions.setdefault((verb, cluster, node), []).append(at)
            counts[verb] = counts.get(verb, 0) + 1
        latencies, missed = [], 0
        for cluster, verb, node, answered in scales:
            later = [at for at in actions.get((verb, cluster, node), []) if at >= answered - 0.5]
            if later:
                latencies.append(max(0.0, min(later) - answered) * 1000)
            else:
                missed += 1
        list_all_started = time.perf_counter()
        total = len(list_all(http))
        list_all_s = time.perf_counter() - list_all_started
        rss = psutil.Process(server.pid).memory_info().rss
        result = {
            "clusters": total,
            "nodes": total * args.nodes,
            "reconcile_p50_ms": round(percentile(latencies, 50), 1) if latencies else None,
            "reconcile_p99_ms": round(percentile(latencies, 99), 1) if latencies else None,
            "scale_calls": len(scales),
            "scale_calls_without_action": missed,
            "api_list_p99_ms": round(percentile(list_ms, 99), 1),
            "api_get_p99_ms": round(percentile(get_ms, 99), 1),
            "api_list_all_s": round(list_all_s, 2),
            "node_failures": counts.get("kill", 0),
            "creates": counts.get("create", 0),
            "store_mb": round((home / "raypod.db").stat().st_size / 2**20, 1),
            "server_rss_mb": round(rss / 2**20),
            "all_ready_s": round(all_ready_s, 1),
        }
        print(json.dumps(result), flush=True)
    finally:
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
