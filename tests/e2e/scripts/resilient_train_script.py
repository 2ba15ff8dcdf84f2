"""A plain Ray Train job, unchanged for raypod: 2 TorchTrainer workers (gloo, CPU), a Ray Train checkpoint every
step, FailureConfig retries. Deterministic, so a run that lost a node and resumed ends with the same weights as
an undisturbed one, which ``undisturbed_weights`` computes in one process (the tests' baseline, without a run).

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


WORLD_SIZE = 2
LEARNING_RATE = 0.05


def initial_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(8, 1)


def loss_of(model: torch.nn.Module, step: int, rank: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(step * 100 + rank)
    inputs = torch.randn(32, 8, generator=generator)
    return ((model(inputs) - inputs.sum(dim=1, keepdim=True)) ** 2).mean()


def weights_of(state_dict: dict[str, torch.Tensor]) -> list[list[float]]:
    return [value.flatten().tolist() for value in state_dict.values()]


def undisturbed_weights(steps: int) -> list[list[float]]:
    """The weights an undisturbed run of ``steps`` steps ends with: DDP gives every rank the mean of the ranks'
    gradients (each divided by the world size, then summed), and SGD keeps no other state."""
    model = initial_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    for step in range(steps):
        parameters = list(model.parameters())
        per_rank = [torch.autograd.grad(loss_of(model, step, rank), parameters) for rank in range(WORLD_SIZE)]
        for index, parameter in enumerate(parameters):
            parameter.grad = sum((grads[index] / WORLD_SIZE for grads in per_rank), torch.zeros_like(parameter))
        optimizer.step()
    return weights_of(model.state_dict())


def train_func(config: dict[str, Any]) -> None:
    model = prepare_model(initial_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
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
        loss = loss_of(model, step, rank)
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
        scaling_config=ScalingConfig(num_workers=WORLD_SIZE, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(name=name, storage_path=STORAGE, failure_config=FailureConfig(max_failures=3)),
    )
    result = trainer.fit()
    assert result.checkpoint is not None
    with result.checkpoint.as_directory() as directory:
        state = torch.load(os.path.join(directory, "state.pt"))
    weights = weights_of(state["model"])
    print("RESULT " + json.dumps({"step": state["step"], "weights": weights, "metrics": result.metrics}), flush=True)


if __name__ == "__main__":
    main()
