"""The Ray Train callback raypod's nodes name in ``RAY_TRAIN_CALLBACKS``: every Ray Train run reports its ranks'
progress to the node's agent with no change to the training script.

Ray Train builds it in the driver (``__init__`` reads the job's submit-time settings there) and hands a copy to
each worker, where the hooks run.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ray.train.v2._internal.execution.callback import TrainContextCallback, WorkerCallback

from raypod import spec as spec_mod
from raypod.capabilities.hangwatch import layout, worker

JOB_CONFIG_VARIABLE = "RAY_JOB_CONFIG_JSON_ENV_VAR"


class HangwatchCallback(WorkerCallback, TrainContextCallback):
    def __init__(self) -> None:
        metadata = _job_metadata()
        # Raises ValueError on a bad rule: the run does not start with a setting silently ignored.
        overrides = spec_mod.hang_overrides_from_metadata(metadata)
        self.job_overrides = None if overrides is None else overrides.model_dump(mode="json", exclude_unset=True)
        self.raypod_job = metadata.get("raypod_job")

    def after_init_train_context(self) -> None:
        root = os.environ.get(layout.DIR_VARIABLE)
        if not root:
            return
        import ray
        from ray.train.v2._internal.execution.context import get_train_context

        context = get_train_context()
        run = context.train_run_context
        ranks = context.distributed_context
        identity = {
            "run_id": run.run_id,
            "run": run.run_config.name,
            # One synchronization actor per worker group: what all ranks of one attempt share.
            "attempt": context.execution_context.synchronization_actor._actor_id.hex()[:16],  # type: ignore[attr-defined]
            "job_id": ray.get_runtime_context().get_job_id(),
            "raypod_job": self.raypod_job,
            "rank": ranks.world_rank,
            "world_size": ranks.world_size,
            "local_rank": ranks.local_rank,
            "node": os.environ.get("RAYPOD_NODE_NAME"),
        }
        worker.start(Path(root), identity, self.job_overrides)

    @contextlib.contextmanager
    def on_report(self) -> Iterator[None]:
        yield  # a report that raised (a reset barrier) is not progress
        recorder = worker.current()
        if recorder is not None:
            recorder.reported()

    @contextlib.contextmanager
    def on_checkpoint_transfer(self) -> Iterator[None]:
        recorder = worker.current()
        if recorder is None:
            yield
            return
        recorder.pause("checkpoint upload")
        try:
            yield
        finally:
            recorder.resume()

    def before_worker_shutdown(self) -> None:
        recorder = worker.current()
        if recorder is not None:
            recorder.finish()


def _job_metadata() -> dict[str, Any]:
    """The metadata of the Ray job this driver runs for (Ray's job supervisor passes it in the environment)."""
    try:
        metadata = json.loads(os.environ.get(JOB_CONFIG_VARIABLE, "{}")).get("metadata") or {}
    except (ValueError, AttributeError):
        return {}
    return {str(k): str(v) for k, v in metadata.items()} if isinstance(metadata, dict) else {}
