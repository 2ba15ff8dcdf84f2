"""What monitoring costs: CPU and RSS of Prometheus, and the latency of raypod's discovery endpoint, while
Prometheus scrapes three clusters for 60 s, against the clusters' own footprint in the same window.

Usage: python benchmarks/monitoring.py [--clusters 3] [--seconds 60]
Needs Debian's prometheus. It starts its own raypod server, head-only clusters and `raypod monitoring up`
(5 s scrape and discovery intervals) in a temporary RAYPOD_HOME. The last line printed is one JSON object:
{"prometheus_cpu_pct", "prometheus_rss_mb", "sd_p50_ms", "server_cpu_pct", "clusters_cpu_pct", "clusters_rss_mb", ...}.
CPU percentages are of one core, averaged over the window.
"""

from __future__ import annotations

import argparse
import json
import ssl
import statistics
import sys
import time

import _common
import httpx
import psutil
from _common import percentile

from raypod.backends import local


def cluster_processes() -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get(local.CLUSTER_MARKER):
                found.append(process)
        except (psutil.Error, OSError):
            continue
    return found


def cpu_seconds(processes: list[psutil.Process]) -> dict[int, float]:
    seconds = {}
    for process in processes:
        try:
            times = process.cpu_times()
            seconds[process.pid] = times.user + times.system
        except psutil.Error:
            continue
    return seconds


def rss_mb(processes: list[psutil.Process]) -> float:
    total = 0
    for process in processes:
        try:
            total += process.memory_info().rss
        except psutil.Error:
            continue
    return total / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clusters", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=60)
    args = parser.parse_args()

    with _common.raypod_server("raypod-mon-bench-") as server:
        names = [f"bench-{i}" for i in range(args.clusters)]
        for name in names:
            server.cli("cluster", "create", name, "--workers", "0")
        server.cli("monitoring", "up", "--port", str(_common.free_port()))
        running = json.loads((server.home / "monitoring" / "prometheus.json").read_text())
        token = (server.home / "monitoring" / "token").read_text()
        credentials = json.loads((server.home / "credentials").read_text())
        sd = httpx.Client(
            headers={"Authorization": f"Bearer {token}"},
            verify=ssl.create_default_context(cafile=credentials["ca_file"]),
            timeout=10,
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            targets = httpx.get(f"{running['url']}/api/v1/targets", params={"state": "active"}).json()
            healthy = {
                t["labels"].get("ray_io_cluster") for t in targets["data"]["activeTargets"] if t["health"] == "up"
            }
            if set(names) <= healthy:
                break
            time.sleep(1)
        else:
            sys.exit(f"targets did not come up: {healthy}")

        prometheus = psutil.Process(running["pid"])
        raypod = psutil.Process(server.process.pid)
        clusters = cluster_processes()
        watched = [prometheus, raypod, *clusters]
        before, started = cpu_seconds(watched), time.monotonic()
        sd_ms, prometheus_rss = [], []
        while time.monotonic() - started < args.seconds:
            start = time.perf_counter()
            sd.get(f"{server.url}/api/v1/monitoring/sd").raise_for_status()
            sd_ms.append((time.perf_counter() - start) * 1000)
            prometheus_rss.append(prometheus.memory_info().rss / 2**20)
            time.sleep(1)
        after, wall = cpu_seconds(watched), time.monotonic() - started
        clusters_rss = rss_mb(clusters)
        sd.close()
        server.cli("monitoring", "down")
        for name in names:
            server.cli("cluster", "delete", name)
        for _ in range(120):
            if not cluster_processes():
                break
            time.sleep(1)

    def pct(pids: list[int]) -> float:
        return round(sum(after[p] - before[p] for p in pids if p in after and p in before) / wall * 100, 2)

    result = {
        "prometheus_cpu_pct": pct([prometheus.pid]),
        "prometheus_rss_mb": round(max(prometheus_rss), 1),
        "sd_p50_ms": round(statistics.median(sd_ms), 2),
        "sd_p95_ms": round(percentile(sd_ms, 95), 2),
        "server_cpu_pct": pct([raypod.pid]),
        "clusters_cpu_pct": pct([p.pid for p in clusters]),
        "clusters_rss_mb": round(clusters_rss, 1),
        "clusters": args.clusters,
        "seconds": round(wall, 1),
    }
    print(
        f"{args.clusters} head-only clusters scraped every 5 s for {wall:.0f} s: Prometheus "
        f"{result['prometheus_cpu_pct']}% CPU / {result['prometheus_rss_mb']} MB against the clusters' "
        f"{result['clusters_cpu_pct']}% CPU / {result['clusters_rss_mb']} MB",
        file=sys.stderr,
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
