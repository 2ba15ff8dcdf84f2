"""A Ray Train run that raypod's governance may preempt: one TorchTrainer worker (CPU), raypod's checkpoint
library for its state (the cluster's shared directory as the disk tier), a checkpoint every EVERY steps and at
once when raypod's preemption notice arrives. A resubmitted run (same name and storage) resumes from the newest
checkpoint, so the result is the same as an undisturbed run's.

Every step appends a line to ``<RUN_DIR>/progress.jsonl`` (step, the step it resumed from, whether a notice made
it save); the last stdout line is ``RESULT {json}``.

Usage: python preemptible_train_script.py RUN_NAME STEPS STEP_SECONDS EVERY
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from typing import Any

from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from raypod.checkpoint import preemption, ray_train

STORAGE = os.environ.get("RAYPOD_SHARED_DIR", tempfile.gettempdir())


def train_func(config: dict[str, Any]) -> None:
    manager = ray_train.checkpoint_manager(os.path.join(config["run_dir"], "tiers"), peer=False)
    restored = ray_train.restore(manager)
    start, total = (restored.step + 1, restored.state["total"]) if restored else (0, 0)
    for step in range(start, config["steps"]):
        total += step * step
        time.sleep(config["step_s"])
        notice = preemption.notice()
        saved = step % config["every"] == 0 or notice is not None or step == config["steps"] - 1
        if saved:
            ray_train.save_and_report(manager, {"total": total}, step, {"total": total}).wait()
        with open(os.path.join(config["run_dir"], "progress.jsonl"), "a") as progress:
            line = {"step": step, "start": start, "saved": saved, "notice": notice is not None, "time": time.time()}
            progress.write(json.dumps(line) + "\n")
        if notice is not None:
            print(f"preemption notice at step {step}: {notice.reason}; saved, waiting to be stopped", flush=True)
            time.sleep(notice.seconds_left + 60)
    manager.close()


def main() -> None:
    name, steps, step_s, every = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    run_dir = os.path.join(STORAGE, name)
    os.makedirs(run_dir, exist_ok=True)
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"steps": steps, "step_s": step_s, "every": every, "run_dir": run_dir},
        scaling_config=ScalingConfig(num_workers=1, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(name=name, storage_path=STORAGE, failure_config=FailureConfig(max_failures=0)),
    )
    result = trainer.fit()
    print("RESULT " + json.dumps({"metrics": result.metrics}), flush=True)


if __name__ == "__main__":
    main()
