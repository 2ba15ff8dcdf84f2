"""Time from `raypod cluster create` to all nodes ALIVE (1 head + 2 workers), next to the same three nodes
started by hand with sequential `ray start` calls, interleaved in one run.

Usage: python benchmarks/cluster_up.py [--rounds N]
The last line printed is one JSON object: {"raypod_s": ..., "plain_ray_start_s": ..., "ratio": ...}.
Goal: ratio <= 1.0. Needs no running raypod: it starts its own server in a temporary RAYPOD_HOME.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
NODE_FLAGS = ["--num-cpus=1", "--memory=1073741824", "--object-store-memory=268435456", "--disable-usage-stats"]


def free_ports(count: int) -> list[int]:
    sockets, ports = [], []
    for _ in range(count):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sockets.append(sock)
        ports.append(sock.getsockname()[1])
    for sock in sockets:
        sock.close()
    return ports


def alive_nodes(gcs: str, token: str) -> int:
    """Alive nodes in a cluster's GCS table, asked with that cluster's Ray token."""
    os.environ.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token})
    from ray._raylet import AuthenticationTokenLoader, GcsClient

    AuthenticationTokenLoader.instance().reset_cache()
    try:
        return sum(1 for info in GcsClient(address=gcs).get_all_node_info(timeout=2).values() if info.state == 0)
    except Exception:
        return 0


def time_raypod(env: dict[str, str], home: Path, name: str) -> float:
    start = time.perf_counter()
    subprocess.run(
        [str(BIN / "raypod"), "cluster", "create", name, "--workers", "2", "-o", "json"],
        env=env,
        check=True,
        capture_output=True,
    )
    elapsed = time.perf_counter() - start
    view = json.loads(
        subprocess.run(
            [str(BIN / "raypod"), "cluster", "get", name, "-o", "json"],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    token = (home / "local" / view["uid"] / "ray-auth-token").read_text().strip()
    alive = alive_nodes(view["status"]["endpoints"]["gcs"], token)
    assert alive == 3, "raypod reported Ready without 3 ALIVE nodes"
    if elapsed > 30:  # show where the time went
        events = subprocess.run(
            [str(BIN / "raypod"), "cluster", "events", name], env=env, capture_output=True, text=True, check=False
        )
        print(events.stdout, file=sys.stderr)
    subprocess.run([str(BIN / "raypod"), "cluster", "delete", name], env=env, check=True, capture_output=True)
    return elapsed


def time_plain_ray_start() -> float:
    """The same three nodes by hand, with the same Ray token authentication raypod's clusters use."""
    gcs, dashboard, client, *agents = free_ports(9)
    temp = tempfile.mkdtemp(prefix="rb-", dir="/tmp")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAYPOD_"))}
    ray = str(BIN / "ray")
    start = time.perf_counter()
    subprocess.run(
        [
            ray,
            "start",
            "--head",
            f"--port={gcs}",
            f"--dashboard-port={dashboard}",
            f"--ray-client-server-port={client}",
            f"--temp-dir={temp}",
            f"--dashboard-agent-listen-port={agents[0]}",
            f"--metrics-export-port={agents[1]}",
            *NODE_FLAGS,
        ],
        env=env,
        check=True,
        capture_output=True,
    )
    for index in (1, 2):
        subprocess.run(
            [
                ray,
                "start",
                f"--address=127.0.0.1:{gcs}",
                "--include-log-monitor=False",
                f"--dashboard-agent-listen-port={agents[2 * index]}",
                f"--metrics-export-port={agents[2 * index + 1]}",
                *NODE_FLAGS,
            ],
            env=env,
            check=True,
            capture_output=True,
        )
    while alive_nodes(f"127.0.0.1:{gcs}", os.environ["RAY_AUTH_TOKEN"]) < 3:
        time.sleep(0.05)
    elapsed = time.perf_counter() - start
    subprocess.run([ray, "stop", "--force"], env=env, check=False, capture_output=True)
    shutil.rmtree(temp, ignore_errors=True)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="raypod-bench-"))
    port = free_ports(1)[0]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAYPOD_", "RAY_"))}
    env.update({"RAYPOD_HOME": str(home), "RAYPOD_SERVER": f"https://127.0.0.1:{port}"})
    with open(home / "server.log", "wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "raypod", "server", "--port", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        import httpx

        for _ in range(100):
            try:
                if httpx.get(f"https://127.0.0.1:{port}/healthz", timeout=1, verify=False).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        # The plain clusters get token authentication too (a token of their own, inherited by `ray start`).
        plain_token = secrets.token_hex(32)
        os.environ.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": plain_token})
        raypod_times, plain_times = [], []
        for round_ in range(args.rounds):
            raypod_times.append(time_raypod(env, home, f"bench-{round_}"))
            plain_times.append(time_plain_ray_start())
            print(
                f"round {round_ + 1}: raypod {raypod_times[-1]:.2f} s, plain ray start {plain_times[-1]:.2f} s",
                flush=True,
            )
    finally:
        server.terminate()
        server.wait(timeout=60)
        shutil.rmtree(home, ignore_errors=True)
    raypod_s, plain_s = statistics.median(raypod_times), statistics.median(plain_times)
    print(
        json.dumps(
            {
                "raypod_s": round(raypod_s, 2),
                "plain_ray_start_s": round(plain_s, 2),
                "ratio": round(raypod_s / plain_s, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
