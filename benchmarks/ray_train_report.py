"""How long ``save_and_report`` blocks a Ray Train worker, side by side in one run: raypod's (Ray Train's
asynchronous upload, recorded once raypod persisted the step) against the plain pattern of ``ray.train.report`` with
a synchronously uploaded checkpoint directory, both around the same raypod memory snapshot.

A real ``TorchTrainer`` with two CPU workers on a local Ray; each step "trains" for ``--step-s`` seconds.

Usage: python benchmarks/ray_train_report.py [--steps 10] [--step-s 0.2]
The last line printed is one JSON object: {"report_async_p50_ms", "report_sync_p50_ms", "fit_async_s",
"fit_sync_s", ...}.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
import ray.train
import torch
from _common import percentile
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from raypod.checkpoint import CheckpointManager, Saved, ray_train


def report_synchronously(manager: CheckpointManager, state: Any, step: int, metrics: dict[str, Any]) -> Saved:
    """The pattern Ray's guide shows: write a folder, report it, Ray uploads it before ``report`` returns."""
    saved = manager.save(state, step)
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / f"{ray_train.MARKER_PREFIX}{manager.rank}.json").write_text(json.dumps({"step": step}))
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(folder))
    return saved


def train_func(config: dict[str, Any]) -> None:
    save_and_report = ray_train.save_and_report if config["mode"] == "async" else report_synchronously
    manager = ray_train.checkpoint_manager(f"{config['dir']}/local", None)
    weights = torch.zeros(2**20)
    blocked = []
    for step in range(config["steps"]):
        time.sleep(config["step_s"])
        weights = weights + 1
        started = time.perf_counter()
        save_and_report(manager, {"w": weights}, step, {"step": step})
        blocked.append((time.perf_counter() - started) * 1000)
    manager.close()
    if ray.train.get_context().get_world_rank() == 0:
        Path(config["dir"], "blocked.json").write_text(json.dumps(blocked))


def run(mode: str, steps: int, step_s: float) -> tuple[list[float], float]:
    folder = tempfile.mkdtemp(prefix=f"raypod-bench-{mode}-")
    started = time.perf_counter()
    TorchTrainer(
        train_func,
        train_loop_config={"mode": mode, "dir": folder, "steps": steps, "step_s": step_s},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name=f"bench-{mode}", storage_path=f"{folder}/results"),
    ).fit()
    fit_s = time.perf_counter() - started
    return json.loads(Path(folder, "blocked.json").read_text()), fit_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--step-s", type=float, default=0.2)
    args = parser.parse_args()
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)
    try:
        results = {}
        for mode in ("sync", "async"):
            blocked, fit_s = run(mode, args.steps, args.step_s)
            results[f"report_{mode}_p50_ms"] = round(percentile(blocked, 50), 1)
            results[f"report_{mode}_max_ms"] = round(max(blocked), 1)
            results[f"fit_{mode}_s"] = round(fit_s, 1)
            print(f"{mode}: report blocked p50 {percentile(blocked, 50):.1f} ms, fit {fit_s:.1f} s", flush=True)
    finally:
        ray.shutdown()
    print(json.dumps({**results, "steps": args.steps, "step_s": args.step_s}))


if __name__ == "__main__":
    main()
