"""A Ray Train run with ``ScalingConfig(num_workers=4)`` on a cluster of one 1-CPU worker that may grow to four:
raypod's autoscaler (Ray's v2 scheduler inside raypod's loop) against Ray's own autoscaler on one host
(``ray.cluster_utils.AutoscalingCluster``: the fake multi-node provider, Ray's monitor), with the same driver, the
same node shape, the same idle timeout and the same upscaling speed, in the same run. Ray's side runs first: its
start and end run ``ray stop --force``, which would stop raypod's nodes too.

The driver (identical on both sides) times, on its own clock:
- ``first_step_s``: ``fit()`` called (the demand) -> the first ``ray.train.report`` of the run.
- ``last_node_s``: ``fit()`` called -> the fourth worker node alive in Ray.
- after ``fit()`` returns, how long until only ``min_replicas`` (1) worker is left: minus the idle timeout, that is
  ``idle_removal_over_timeout_s``.
- ``nodes_beyond_demand``: the most worker nodes alive at once, minus the four the run needs.

Usage: python benchmarks/autoscaling.py [--idle-timeout 10]
Last line: one JSON object. Goals: ratio = first_step_s / ray_autoscaler_first_step_s <= 1.0;
idle_removal_over_timeout_s <= 5; nodes_beyond_demand == 0.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import raypod_server

from raypod import spec as spec_mod
from raypod.client import Client

WORKERS = 4
DRIVER = """
import json, sys, threading, time
import ray, ray.train
from ray.train import ScalingConfig
from ray.train.torch import TorchTrainer

IDLE_TIMEOUT_S = float(sys.argv[1])
ray.init(address="auto")
peak, last_node = [0], [None]


def workers():
    return sum(1 for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) > 0)


def watch(stop):
    while not stop.is_set():
        alive = workers()
        peak[0] = max(peak[0], alive)
        if alive >= {WORKERS} and last_node[0] is None:
            last_node[0] = time.time()
        time.sleep(0.1)


def train_func(config):
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(b"first_step", str(time.time()).encode(), overwrite=False)
    ray.train.report({"step": 0})


stop = threading.Event()
threading.Thread(target=watch, args=(stop,), daemon=True).start()
demand = time.time()
TorchTrainer(train_func, scaling_config=ScalingConfig(num_workers={WORKERS})).fit()
ended = time.time()
from ray.experimental import internal_kv
first_step = float(internal_kv._internal_kv_get(b"first_step"))
removed = None
while time.time() - ended < IDLE_TIMEOUT_S + 120:
    if workers() <= 1:
        removed = time.time()
        break
    time.sleep(0.1)
stop.set()
print("RESULT " + json.dumps({
    "first_step_s": first_step - demand,
    "last_node_s": (last_node[0] or float("nan")) - demand,
    "idle_removal_s": (removed - ended) if removed else None,
    "peak_workers": peak[0],
}))
""".replace("{WORKERS}", str(WORKERS))


def result_of(output: str) -> dict[str, Any]:
    found = re.search(r"^RESULT (.*)$", output, re.MULTILINE)
    if found is None:
        raise RuntimeError(f"the driver printed no result:\n{output[-4000:]}")
    return dict(json.loads(found.group(1)))


# Ray's fake_multi_node/example.yaml, which AutoscalingCluster starts from; Ray's wheel leaves the file out.
FAKE_MULTINODE_BASE: dict[str, Any] = {
    "cluster_name": "fake_multinode",
    "max_workers": 8,
    "provider": {
        "type": "fake_multinode",
        "use_node_id_as_ip": True,
        "disable_node_updaters": True,
        "disable_launch_config_check": True,
    },
    "head_node_type": "ray.head.default",
    "auth": {},
    "upscaling_speed": 1.0,
    "idle_timeout_minutes": 0.1,
    "docker": {},
    "initialization_commands": [],
    "setup_commands": [],
    "head_setup_commands": [],
    "worker_setup_commands": [],
    "head_start_ray_commands": [],
    "worker_start_ray_commands": [],
    "file_mounts": {},
    "cluster_synced_files": [],
    "file_mounts_sync_continuously": False,
    "rsync_exclude": [],
    "rsync_filter": [],
}


def ray_autoscaler(driver: Path, idle_timeout_s: int) -> dict[str, Any]:
    """The same run on Ray's own autoscaler: a 0-CPU head, worker type ``cpu`` (1 CPU) with min 1, max 4."""
    from ray.cluster_utils import AutoscalingCluster

    class OneHostCluster(AutoscalingCluster):  # type: ignore[misc]
        def _generate_config(
            self, head_resources: dict[str, Any], worker_node_types: dict[str, Any], **config_kwargs: Any
        ) -> dict[str, Any]:
            config = json.loads(json.dumps(FAKE_MULTINODE_BASE))
            config["available_node_types"] = dict(worker_node_types)
            config["available_node_types"]["ray.head.default"] = {
                "resources": head_resources,
                "node_config": {},
                "max_workers": 0,
            }
            config.update({k: v for k, v in config_kwargs.items() if k != "autoscaler_v2"})
            return config

    cluster = OneHostCluster(
        head_resources={"CPU": 0},
        worker_node_types={
            "cpu": {"resources": {"CPU": 1}, "node_config": {}, "min_workers": 1, "max_workers": WORKERS}
        },
        idle_timeout_minutes=idle_timeout_s / 60,
        upscaling_speed=1000,  # raypod's Default, as KubeRay maps it
    )
    cluster.start()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
        deadline = time.monotonic() + 120
        probe = "import ray; ray.init(address='auto'); import sys; sys.exit(0 if any(n['Alive'] and n['Resources'].get('CPU', 0) > 0 for n in ray.nodes()) else 1)"  # noqa: E501
        while subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True).returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError("Ray's autoscaler did not start its min_workers node in 120 s")
            time.sleep(1)
        done = subprocess.run(
            [sys.executable, str(driver), str(idle_timeout_s)], env=env, capture_output=True, text=True, timeout=900
        )
        return result_of(done.stdout + done.stderr)
    finally:
        cluster.shutdown()


def raypod(driver: Path, idle_timeout_s: int) -> dict[str, Any]:
    spec = {
        "name": "grow",
        "head": {"cpus": 0, "memory": "1Gi", "object_store_memory": "256Mi"},
        "worker_groups": [
            {
                "name": "cpu",
                "replicas": 1,
                "min_replicas": 1,
                "max_replicas": WORKERS,
                "cpus": 1,
                "memory": "1Gi",
                "object_store_memory": "256Mi",
            }
        ],
        "autoscaling": {"idle_timeout_s": idle_timeout_s},
    }
    with raypod_server("raypod-bench-autoscaling-") as server:
        os.environ.update({k: v for k, v in server.env.items() if k.startswith("RAYPOD_")})
        with Client() as api:
            api.clusters.create(spec)
            try:
                api.clusters.wait_ready("grow", timeout=300)
                uri = api.jobs.upload_working_dir("grow", [("run/driver.py", driver.read_bytes())])
                job = api.jobs.submit(
                    "grow",
                    spec_mod.JobSpec(entrypoint=f"python driver.py {idle_timeout_s}", runtime_env={"working_dir": uri}),
                )
                api.jobs.wait(job.id, timeout=900)
                return result_of(api.jobs.logs(job.id))
            finally:
                api.clusters.delete("grow")
                api.clusters.wait_deleted("grow", timeout=300)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle-timeout", type=int, default=10)
    args = parser.parse_args()
    # Ray's one-host cluster runs `ray start` and `ray stop`: this environment's.
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    with tempfile.TemporaryDirectory(prefix="raypod-bench-autoscaling-") as tmp:
        driver = Path(tmp) / "driver.py"
        driver.write_text(DRIVER)
        ray_side = ray_autoscaler(driver, args.idle_timeout)
        print(f"Ray's autoscaler: {ray_side}", flush=True)
        ours = raypod(driver, args.idle_timeout)
        print(f"raypod: {ours}", flush=True)

    def over_timeout(side: dict[str, Any]) -> float | None:
        removal = side["idle_removal_s"]
        return None if removal is None else round(removal - args.idle_timeout, 2)

    print(
        json.dumps(
            {
                "first_step_s": round(ours["first_step_s"], 2),
                "ray_autoscaler_first_step_s": round(ray_side["first_step_s"], 2),
                "ratio": round(ours["first_step_s"] / ray_side["first_step_s"], 3),
                "last_node_s": round(ours["last_node_s"], 2),
                "ray_autoscaler_last_node_s": round(ray_side["last_node_s"], 2),
                "idle_timeout_s": args.idle_timeout,
                "idle_removal_over_timeout_s": over_timeout(ours),
                "ray_autoscaler_idle_removal_over_timeout_s": over_timeout(ray_side),
                "nodes_beyond_demand": ours["peak_workers"] - WORKERS,
                "ray_autoscaler_nodes_beyond_demand": ray_side["peak_workers"] - WORKERS,
            }
        )
    )


if __name__ == "__main__":
    main()
