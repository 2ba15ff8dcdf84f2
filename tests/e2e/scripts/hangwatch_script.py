"""Ray Train runs for hang detection tests, unchanged Ray except where a scenario says otherwise.

Scenarios (2 ranks, gloo on CPU):
- ``healthy N``: N runs one after another, each with a slow start (longer than the hang timeout, shorter than
  the start timeout), a checkpoint whose upload is slow, an evaluation inside ``raypod.hangwatch.paused()``, and
  an "out of memory" line (a rule matches it without fault_on_match): none of it is a hang.
- ``hang``: rank 0 sleeps forever at step 3 while rank 1 blocks in the next all-reduce.
- ``oom``: rank 1 prints a CUDA out-of-memory line at step 2, then trains on slowly.
- ``hangs N``: one run; each attempt reports 3 steps, then rank 0 hangs, N times (the benchmark's injections);
  the attempt after the last hang finishes.
- ``steady N``: one run of N short steps; prints ``STEPS {json}`` with each step's seconds (the agent's cost).

Usage: python hangwatch_script.py SCENARIO [N] ; prints ``DONE {json}`` at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist
from ray import train
from ray.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

import raypod.hangwatch

STORAGE = os.environ.get("RAYPOD_SHARED_DIR", tempfile.gettempdir())
PHASE_S = float(os.environ.get("PHASE_S", "4"))  # slow start, slow upload, evaluation: each past the timeout


def slow_upload(checkpoint: Checkpoint, directory_name: str) -> Checkpoint:
    """Ray's upload, slower than the hang timeout (a big checkpoint on slow storage)."""
    time.sleep(PHASE_S)
    destination = os.path.join(train.get_context().get_storage().experiment_fs_path, directory_name)
    shutil.copytree(checkpoint.path, destination, dirs_exist_ok=True)
    return Checkpoint.from_directory(destination)


def train_func(config: dict[str, Any]) -> None:
    rank = train.get_context().get_world_rank()
    scenario = config["scenario"]
    if scenario == "steady":
        steady(rank, config["steps"])
        return
    if scenario == "hangs":
        marker = os.path.join(config["run_dir"], "hangs")
        for step in range(3):
            dist.all_reduce(torch.ones(1))
            train.report({"step": step})
        done = len(os.listdir(marker)) if os.path.isdir(marker) else 0
        if rank == 0 and done < config["hangs"]:
            os.makedirs(marker, exist_ok=True)
            open(os.path.join(marker, str(done)), "w").close()
            time.sleep(10**6)
        dist.all_reduce(torch.ones(1))
        return
    if scenario == "healthy":
        time.sleep(PHASE_S)  # data loading before the first step
    for step in range(config["steps"]):
        value = torch.ones(1)
        if scenario == "hang" and step == 3 and rank == 0:
            print("rank 0 stops at step 3", flush=True)
            time.sleep(10**6)
        if scenario == "oom" and step == 2 and rank == 1:
            print("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)
        if scenario == "healthy" and step == 2 and rank == 1:
            print("warning: near out of memory, shrinking the batch", flush=True)
        dist.all_reduce(value)
        time.sleep(config["step_s"])
        if scenario == "healthy" and step == 1:
            with tempfile.TemporaryDirectory() as directory:
                with open(os.path.join(directory, "state.json"), "w") as handle:
                    json.dump({"step": step}, handle)
                # Rank 0 alone saves: rank 1 waits for it in the next all-reduce, stuck-looking but not hung.
                train.report(
                    {"step": step},
                    checkpoint=Checkpoint.from_directory(directory) if rank == 0 else None,
                    checkpoint_upload_fn=slow_upload,
                )
            continue
        if scenario == "healthy" and step == 3:
            with raypod.hangwatch.paused("evaluation"):
                time.sleep(PHASE_S)
        train.report({"step": step})


def steady(rank: int, steps: int) -> None:
    model = torch.nn.Linear(256, 256)
    inputs = torch.randn(64, 256)
    times = []
    for step in range(steps):
        started = time.perf_counter()
        for _ in range(20):
            model(inputs).sum().backward()
        for parameter in model.parameters():
            dist.all_reduce(parameter.grad)
        train.report({"step": step})
        times.append(time.perf_counter() - started)
    if rank == 0:
        print("STEPS " + json.dumps(times), flush=True)


def main() -> None:
    scenario = sys.argv[1]
    runs = int(sys.argv[2]) if len(sys.argv) > 2 and scenario == "healthy" else 1
    results = []
    for index in range(runs):
        name = f"{scenario}-{os.environ.get('RUN_TAG', 'x')}-{index}"
        run_dir = os.path.join(STORAGE, name)
        os.makedirs(run_dir, exist_ok=True)
        count = int(sys.argv[2]) if len(sys.argv) > 2 else 0
        steps = {"oom": 12, "steady": count}.get(scenario, 6)
        trainer = TorchTrainer(
            train_func,
            train_loop_config={"scenario": scenario, "steps": steps, "step_s": 0.3, "run_dir": run_dir, "hangs": count},
            scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
            run_config=RunConfig(
                name=name,
                storage_path=STORAGE,
                failure_config=FailureConfig(max_failures=count + 1 if scenario == "hangs" else 0),
            ),
        )
        result = trainer.fit()
        results.append(result.metrics)
    print("DONE " + json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
