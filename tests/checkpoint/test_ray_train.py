"""Ray Train resumes from the fastest tier after a worker is killed: a real TorchTrainer (two workers, gloo),
FailureConfig restarts, raypod tiers underneath. This is the README's example, as a test."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
import torch
from ray.train import CheckpointConsistencyMode, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from raypod.checkpoint import ray_train

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(600),
    # Ray Train's own imports warn about Ray Data settings they touch; not ours to fix.
    pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.data.context"),
]
STEPS = 8
KILL_AT = 4


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=3, object_store_memory=200 * 2**20, include_dashboard=False)
    try:
        yield
    finally:
        ray.shutdown()


def train_func(config: dict[str, Any]) -> None:
    manager = ray_train.checkpoint_manager(config["local_dir"], config["durable_url"])
    reported = ray_train.reported_step()
    restored = ray_train.restore(manager)
    start = restored.step + 1 if restored else 0
    weights = restored.state["w"] if restored else torch.zeros(1024)
    rank = ray.train.get_context().get_world_rank()
    for step in range(start, STEPS):
        weights = weights + 1  # the "training": after step s, every weight is s + 1
        ray_train.save_and_report(
            manager,
            {"w": weights, "step": step},
            step,
            {
                "w": float(weights[0]),
                "start": start,
                "reported": reported,
                "tier": restored.tier if restored else "fresh",
            },
        )
        if restored is None and step == KILL_AT and rank == 0:
            # A worker dies mid-run, a moment after its last report: by then raypod persisted the step and Ray
            # Train recorded it (reports are recorded in the background, after raypod persisted the step).
            ray.train.get_all_reported_checkpoints(consistency_mode=CheckpointConsistencyMode.COMMITTED)
            os.kill(os.getpid(), signal.SIGKILL)
    manager.close()


def test_a_killed_worker_resumes_from_the_fastest_tier(local_ray: None, tmp_path: Path) -> None:
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"local_dir": str(tmp_path / "local"), "durable_url": f"file://{tmp_path / 'durable'}"},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(
            name="raypod-resume", storage_path=str(tmp_path / "results"), failure_config=FailureConfig(max_failures=1)
        ),
    )
    result = trainer.fit()
    assert result.error is None
    metrics = result.metrics
    # One node: the restarted workers' own memory is gone and there is no peer, so the local disk is fastest.
    assert metrics["tier"] == "disk"
    # Resumed right after the last step Ray Train recorded for every rank: the step of the kill.
    assert (metrics["reported"], metrics["start"]) == (KILL_AT, KILL_AT + 1)
    assert metrics["w"] == STEPS  # the state restored matches its step
    assert metrics["raypod_step"] == STEPS - 1
