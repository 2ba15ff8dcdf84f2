"""Latency the gateway adds: 200 job-status reads and 5 submit-to-SUCCEEDED round trips, through raypod's
gateway (HTTPS, token auth, proxy) and directly against the cluster's Ray dashboard, interleaved in one run.

Usage: python benchmarks/gateway.py [--reads 200] [--round-trips 5]
The last line printed is one JSON object:
{"direct_p50_ms", "gateway_p50_ms", "added_p50_ms", "direct_p95_ms", "gateway_p95_ms", ...}. Goal: added <= 2 ms.
It starts its own raypod server and a head-only cluster in a temporary RAYPOD_HOME.
"""

from __future__ import annotations

import argparse
import json
import ssl
import statistics
import time

import _common
import httpx
from _common import percentile


def round_trip(client: httpx.Client, base: str) -> float:
    start = time.perf_counter()
    job = client.post(f"{base}/api/jobs/", json={"entrypoint": "echo hi"}).json()["submission_id"]
    while client.get(f"{base}/api/jobs/{job}").json()["status"] != "SUCCEEDED":
        time.sleep(0.05)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=200)
    parser.add_argument("--round-trips", type=int, default=5)
    args = parser.parse_args()

    with _common.raypod_server("raypod-gw-bench-") as server:
        home, port = server.home, server.port
        server.cli("cluster", "create", "bench", "-o", "json")
        view = json.loads(server.cli("cluster", "get", "bench", "-o", "json"))
        credentials = json.loads((home / "credentials").read_text())
        ray_token = (home / "local" / view["uid"] / "ray-auth-token").read_text().strip()
        direct_base = view["status"]["endpoints"]["dashboard"]
        gateway_base = f"https://127.0.0.1:{port}/clusters/default/bench"
        direct = httpx.Client(headers={"Authorization": f"Bearer {ray_token}"}, timeout=30)
        gateway = httpx.Client(
            headers={"Authorization": f"Bearer {credentials['token']}"},
            timeout=30,
            verify=ssl.create_default_context(cafile=credentials["ca_file"]),
        )
        job = direct.post(f"{direct_base}/api/jobs/", json={"entrypoint": "echo warm"}).json()["submission_id"]
        for client, base in ((direct, direct_base), (gateway, gateway_base)):  # warm connections and caches
            for _ in range(10):
                client.get(f"{base}/api/jobs/{job}").raise_for_status()

        reads: dict[str, list[float]] = {"direct": [], "gateway": []}
        for i in range(args.reads):
            order = [("direct", direct, direct_base), ("gateway", gateway, gateway_base)]
            for name, client, base in order if i % 2 == 0 else order[::-1]:
                start = time.perf_counter()
                client.get(f"{base}/api/jobs/{job}").raise_for_status()
                reads[name].append((time.perf_counter() - start) * 1000)

        trips: dict[str, list[float]] = {"direct": [], "gateway": []}
        for i in range(args.round_trips):
            order = [("direct", direct, direct_base), ("gateway", gateway, gateway_base)]
            for name, client, base in order if i % 2 == 0 else order[::-1]:
                trips[name].append(round_trip(client, base))
        direct.close()
        gateway.close()
        server.cli("cluster", "delete", "bench")

    direct_p50, gateway_p50 = statistics.median(reads["direct"]), statistics.median(reads["gateway"])
    print(f"job-status reads ({args.reads} each): direct p50 {direct_p50:.2f} ms, gateway p50 {gateway_p50:.2f} ms")
    print(
        f"submit-to-SUCCEEDED ({args.round_trips} each): direct median {statistics.median(trips['direct']):.2f} s, "
        f"gateway median {statistics.median(trips['gateway']):.2f} s"
    )
    print(
        json.dumps(
            {
                "direct_p50_ms": round(direct_p50, 2),
                "gateway_p50_ms": round(gateway_p50, 2),
                "added_p50_ms": round(gateway_p50 - direct_p50, 2),
                "direct_p95_ms": round(percentile(reads["direct"], 95), 2),
                "gateway_p95_ms": round(percentile(reads["gateway"], 95), 2),
                "direct_submit_p50_s": round(statistics.median(trips["direct"]), 2),
                "gateway_submit_p50_s": round(statistics.median(trips["gateway"]), 2),
            }
        )
    )


if __name__ == "__main__":
    main()
