"""Server time to render console pages with 100 clusters and 1,000 events in the store.

Usage: python benchmarks/console.py [--clusters 100] [--events 1000] [--requests 200]
A real raypod server (uvicorn, HTTP on loopback, the in-memory fake backend so 100 clusters fit on a laptop)
is filled through its API; then the clusters list, one cluster page, and, as the baseline, the JSON list of
the same clusters (``GET /api/v1/clusters``) are requested in turn, interleaved, over one keep-alive
connection. Times are whole HTTP round trips, so they bound the server's rendering time from above.
The last line printed is one JSON object:
{"clusters_list_p50_ms", "cluster_page_p50_ms", "api_list_p50_ms", ...}. Goal: <= 50 ms p50 for both pages.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import uvicorn
from _common import free_port, percentile

from raypod import config, state
from raypod.backends import base
from raypod.backends.fake import FakeBackend
from raypod.controlplane import store
from raypod.server.app import create_app


def fill(client: httpx.Client, app_state: object, clusters: int, events: int) -> None:
    """Create the clusters through the API, wait until they are Ready, then top events up to ``events``."""
    for index in range(clusters):
        spec = {
            "name": f"c{index:03d}",
            "head": {"memory": "256Mi", "object_store_memory": "80Mi"},
            "worker_groups": [{"name": "cpu", "replicas": 2, "memory": "256Mi", "object_store_memory": "80Mi"}],
            "env": {"TEAM": f"team-{index % 7}"},
        }
        client.post("/api/v1/clusters", json=spec).raise_for_status()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        phases = {view["status"]["phase"] for view in client.get("/api/v1/clusters").json()}
        if phases == {"Ready"}:
            break
        time.sleep(0.2)
    else:
        raise SystemExit(f"clusters did not become Ready: {phases}")
    db = app_state.clusters.store  # type: ignore[attr-defined]
    views = db.list()
    existing = len(db.search_events(store.EventFilter(), limit=10**6))
    for number in range(max(0, events - existing)):
        view = views[number % len(views)]
        kind = state.EventType.WARNING if number % 10 == 0 else state.EventType.NORMAL
        db.record(view, kind, "NodeHealthChecked", f"heartbeat {number}: all nodes answered", node="cpu-0")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clusters", type=int, default=100)
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="raypod-console-bench-"))
    settings = config.Settings(home=home, tls=False, reconcile_interval_s=0.2)
    backend = FakeBackend(
        capacity=base.HostCapacity(cpus_per_node=8, memory_bytes=2**40, shared_memory_bytes=2**40, gpus_per_node=0)
    )
    app = create_app(settings, backend=backend)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    token = json.loads((home / "credentials").read_text())["token"]
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=30) as client:
        fill(client, app.state, args.clusters, args.events)
        stored_events = len(app.state.clusters.store.search_events(store.EventFilter(), limit=10**6))
        paths = {
            "clusters_list": "/",
            "cluster_page": "/namespaces/default/clusters/c042",
            "api_list": "/api/v1/clusters",
        }
        for path in paths.values():  # warm up templates and connections
            client.get(path).raise_for_status()
        times: dict[str, list[float]] = {name: [] for name in paths}
        for _ in range(args.requests):
            for name, path in paths.items():
                start = time.perf_counter()
                response = client.get(path)
                times[name].append((time.perf_counter() - start) * 1000)
                response.raise_for_status()
        listed = client.get("/").text.count("<tr data-cluster=")
    server.should_exit = True
    thread.join(timeout=30)

    result = {f"{name}_p50_ms": round(statistics.median(values), 2) for name, values in times.items()}
    result |= {f"{name}_p95_ms": round(percentile(values, 95), 2) for name, values in times.items()}
    result |= {"clusters": listed, "events": stored_events, "requests_each": args.requests}
    print(
        f"{listed} clusters, {stored_events} events; {args.requests} requests each, interleaved "
        f"(times are HTTP round trips on loopback)",
        file=sys.stderr,
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
