"""A plain Ray Train job, unchanged for raypod: 2 TorchTrainer workers (gloo, CPU), a Ray Train checkpoint every
step, FailureConfig retries. Deterministic, so a run that lost a node and resumed ends with the same weights as
an undisturbed one.

Every step appends a line to ``<RUN_DIR>/progress.jsonl`` (rank, step, the step it resumed from, wall time), so
tests and the recovery benchmark see progress without parsing logs. The last stdout line is ``RESULT {json}``.

With HANG_AT, rank 0 of the first attempt stops at that step for good (asleep, while rank 1 waits in the next
all-reduce): a hung run, as a stuck rank makes one.

Usage: python resilient_train_script.py RUN_NAME STEPS STEP_SECONDS [HANG_AT]
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from typing import Any

import torch
from ray import train
from ray.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer, prepare_model

# One filesystem every node sees: the cluster's shared directory on raypod's local backend, else /tmp.
STORAGE = os.environ.get("RAYPOD_SHARED_DIR", tempfile.gettempdir())


def train_func(config: dict[str, Any]) -> None:
    torch.manual_seed(0)
    model = prepare_model(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    start = 0
    checkpoint = train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as directory:
            saved = torch.load(os.path.join(directory, "state.pt"))
        model.module.load_state_dict(saved["model"])
        start = saved["step"] + 1
    rank = train.get_context().get_world_rank()
    hang_marker = os.path.join(config["run_dir"], "hung-once")
    for step in range(start, config["steps"]):
        if step == config["hang_at"] and rank == 0 and not os.path.exists(hang_marker):
            open(hang_marker, "w").close()
            print(f"rank 0 hangs at step {step}", flush=True)
            time.sleep(10**6)
        generator = torch.Generator().manual_seed(step * 100 + rank)
        inputs = torch.randn(32, 8, generator=generator)
        loss = ((model(inputs) - inputs.sum(dim=1, keepdim=True)) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(config["step_s"])
        with tempfile.TemporaryDirectory() as directory:
            if rank == 0:
                torch.save({"model": model.module.state_dict(), "step": step}, os.path.join(directory, "state.pt"))
            train.report(
                {"step": step, "loss": float(loss), "start": start},
                checkpoint=Checkpoint.from_directory(directory) if rank == 0 else None,
            )
        with open(os.path.join(config["run_dir"], "progress.jsonl"), "a") as progress:
            line = {
                "rank": rank,
                "step": step,
                "start": start,
                "time": time.time(),
                "node": os.environ.get("RAYPOD_NODE_NAME"),
            }
            progress.write(json.dumps(line) + "\n")


def main() -> None:
    name, steps, step_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    hang_at = int(sys.argv[4]) if len(sys.argv) > 4 else -1
    run_dir = os.path.join(STORAGE, name)
    os.makedirs(run_dir, exist_ok=True)
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"steps": steps, "step_s": step_s, "run_dir": run_dir, "hang_at": hang_at},
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(name=name, storage_path=STORAGE, failure_config=FailureConfig(max_failures=3)),
    )
    result = trainer.fit()
    assert result.checkpoint is not None
    with result.checkpoint.as_directory() as directory:
        state = torch.load(os.path.join(directory, "state.pt"))
    weights = [value.flatten().tolist() for value in state["model"].values()]
    print("RESULT " + json.dumps({"step": state["step"], "weights": weights, "metrics": result.metrics}), flush=True)


if __name__ == "__main__":
    main()
