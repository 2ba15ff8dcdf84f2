"""Time from ``raypod space create`` to a notebook kernel that has run ``ray.init(address="auto")`` on the cluster,
against doing it by hand: starting ``jupyter lab`` on the head's host with the cluster's address and token, then
the same kernel and cell, with no gateway in between. Both on the same two-node cluster, in one run.

- ``space_ready_s``: create -> IDE answers through the gateway -> kernel started -> ``ray.init`` cell done.
- ``manual_ready_s``: ``jupyter lab`` started -> it answers -> kernel started -> the same cell done.
- ``first_cell_ms``: the ``ray.init`` cell alone, in the workspace.

Usage: python benchmarks/spaces.py [--runs 3]
Last line: one JSON object. Goal: ratio = space_ready_s / manual_ready_s <= 1.5.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import websockets.sync.client
from _common import raypod_server

from raypod.client import Client
from raypod.client._http import tls_verify
from raypod.testing import free_port

CELL = "import ray\nray.init(address='auto')\nprint(len(ray.nodes()))\n"


def run_cell(ws: Any, code: str) -> None:
    msg_id = uuid.uuid4().hex
    header = {"msg_id": msg_id, "msg_type": "execute_request", "username": "b", "session": "b", "version": "5.3"}
    content = {"code": code, "silent": False, "store_history": False, "user_expressions": {}, "allow_stdin": False}
    ws.send(json.dumps({"header": header, "parent_header": {}, "metadata": {}, "content": content, "channel": "shell"}))
    while True:
        message = json.loads(ws.recv(timeout=300))
        if message.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        if message["msg_type"] == "error":
            raise RuntimeError("\n".join(message["content"]["traceback"])[-2000:])
        if message["msg_type"] == "status" and message["content"]["execution_state"] == "idle":
            return


def kernel_cell(http: httpx.Client, ws_base: str, headers: dict[str, str], ssl_context: Any) -> float:
    """Start a kernel, run the ray.init cell; return the cell's seconds."""
    created = http.post("api/kernels", json={"name": "python3"})
    created.raise_for_status()
    url = f"{ws_base}api/kernels/{created.json()['id']}/channels"
    with websockets.sync.client.connect(url, ssl=ssl_context, additional_headers=headers, max_size=None) as ws:
        started = time.perf_counter()
        run_cell(ws, CELL)
        return time.perf_counter() - started


def wait_answers(http: httpx.Client, deadline_s: float = 120) -> None:
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            if http.get("api/status").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("jupyter lab did not answer")
        time.sleep(0.1)


def manual(view_gcs: str, ray_token: str, work: Path) -> float:
    """jupyter lab by hand on the head's host, with the cluster's address and token in its environment."""
    port, token = free_port(), secrets.token_hex(16)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "RAYPOD_"))}
    env.update({"RAY_ADDRESS": view_gcs, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": ray_token, "JUPYTER_TOKEN": token})
    started = time.perf_counter()
    command = [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ip=127.0.0.1"]
    command += [f"--port={port}", f"--ServerApp.root_dir={work}"]
    with open(work / "lab.log", "wb") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=work)
    try:
        headers = {"Authorization": f"token {token}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}/", headers=headers, timeout=60) as http:
            wait_answers(http)
            kernel_cell(http, f"ws://127.0.0.1:{port}/", headers, None)
        return time.perf_counter() - started
    finally:
        process.terminate()
        process.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    spec = {"name": "spacebench", "head": {"cpus": 1}, "worker_groups": [{"name": "w", "replicas": 1, "cpus": 1}]}
    space_s, manual_s, cells = [], [], []
    with raypod_server("raypod-spacebench-") as server:
        os.environ.update({k: v for k, v in server.env.items() if k.startswith("RAYPOD_")})
        ca = str(server.home / "tls" / "ca.crt")
        os.environ["RAYPOD_CA_FILE"] = ca
        token = json.loads((server.home / "credentials").read_text())["token"]
        headers = {"Authorization": f"Bearer {token}"}
        context = ssl.create_default_context(cafile=ca)
        with Client() as api:
            try:
                view = api.clusters.create(spec)
                view = api.clusters.wait_ready("spacebench", timeout=300)
                ray_token = (server.home / "local" / view.uid / "ray-auth-token").read_text().strip()
                for run in range(args.runs):
                    name = f"b{run}"
                    started = time.perf_counter()
                    api.spaces.create(name, "spacebench")
                    api.spaces.wait_ready(name, timeout=300)
                    base = f"{server.url}/spaces/default/{name}/"
                    with httpx.Client(base_url=base, headers=headers, verify=tls_verify(ca), timeout=60) as http:
                        cell = kernel_cell(http, base.replace("https://", "wss://"), headers, context)
                    space_s.append(time.perf_counter() - started)
                    cells.append(cell)
                    api.spaces.delete(name, keep_files=False)
                    with tempfile.TemporaryDirectory() as work:
                        manual_s.append(manual(view.status.endpoints["gcs"], ray_token, Path(work)))
                    print(f"run {run}: workspace {space_s[-1]:.2f} s, by hand {manual_s[-1]:.2f} s", flush=True)
            finally:
                api.clusters.delete("spacebench")
                api.clusters.wait_deleted("spacebench", timeout=120)
    space_ready, manual_ready = statistics.median(space_s), statistics.median(manual_s)
    result = {
        "space_ready_s": round(space_ready, 2),
        "manual_ready_s": round(manual_ready, 2),
        "ratio": round(space_ready / manual_ready, 2),
        "first_cell_ms": round(statistics.median(cells) * 1000, 1),
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
