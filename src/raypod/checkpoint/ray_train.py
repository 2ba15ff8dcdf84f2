"""Ray Train helpers: a CheckpointManager for the current worker, saving with a report, and restoring inside
``train_func`` after a ``FailureConfig`` restart.

    def train_func(config):
        manager = ray_train.checkpoint_manager("/tmp/ckpt", durable_url="s3://bucket/ckpt")
        restored = ray_train.restore(manager)           # None on a fresh start
        start = restored.step + 1 if restored else 0
        ...
        ray_train.save_and_report(manager, state, step, {"loss": loss})

Ray Train records, with each report, a tiny checkpoint naming the step (one file per rank), once raypod has
persisted that step, so after a restart ``ray.train.get_checkpoint()`` says which step every rank reported; the
state itself comes from the fastest raypod tier that holds that step: the peer node's memory, the local disk, or
durable storage (the process' own memory tier is gone after a restart).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import ray
import ray.train

from raypod.checkpoint.manager import DEFAULT_RETENTION, CheckpointManager, Restored, Retention, Saved

MARKER_PREFIX = "raypod-rank-"


def checkpoint_manager(
    local_dir: str | Path,
    durable_url: str | None = None,
    *,
    run: str | None = None,
    peer: bool | None = None,
    retention: Retention = DEFAULT_RETENTION,
    storage_options: dict[str, Any] | None = None,
) -> CheckpointManager:
    """A manager for this Ray Train worker: its rank and world size, the run named after the experiment, and a
    peer replica when the cluster has another node (``peer=None``)."""
    context = ray.train.get_context()
    if peer is None:
        peer = len([node for node in ray.nodes() if node["Alive"]]) > 1  # type: ignore[no-untyped-call]
    return CheckpointManager(
        run or context.get_experiment_name(),
        local_dir,
        durable_url,
        rank=context.get_world_rank(),
        world_size=context.get_world_size(),
        retention=retention,
        peer=peer,
        storage_options=storage_options,
    )


def save_and_report(manager: CheckpointManager, state: Any, step: int, metrics: dict[str, Any]) -> Saved:
    """Snapshot ``state`` and report ``metrics`` with a checkpoint that names the step; returns after the memory
    copy. Every rank must call it, as with ``ray.train.report``.

    The report uses Ray Train's asynchronous upload with an upload function that first waits until raypod has
    persisted the step: training never waits for storage, and the step Ray Train hands back after a failure is
    one raypod's tiers hold."""
    saved = manager.save(state, step)
    storage = ray.train.get_context().get_storage()
    folder = Path(tempfile.mkdtemp(prefix="raypod-train-"))  # Ray deletes it once uploaded
    marker = {"step": step, "run": manager.run, "world_size": manager.world_size}
    (folder / f"{MARKER_PREFIX}{manager.rank}.json").write_text(json.dumps(marker))

    def upload_once_persisted(checkpoint: ray.train.Checkpoint, dir_name: str) -> ray.train.Checkpoint:
        saved.wait()
        persisted: ray.train.Checkpoint = storage.persist_current_checkpoint(checkpoint, dir_name)
        return persisted

    ray.train.report(
        {**metrics, "raypod_step": step, "raypod_stall_ms": saved.stall_s * 1000},
        checkpoint=ray.train.Checkpoint.from_directory(folder),
        checkpoint_upload_mode=ray.train.CheckpointUploadMode.ASYNC,
        checkpoint_upload_fn=upload_once_persisted,
    )
    return saved


def reported_step() -> int | None:
    """The step of the newest checkpoint every rank reported, or None on a fresh start."""
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as folder:
        markers = sorted(Path(folder).glob(f"{MARKER_PREFIX}*.json"))
        if not markers:
            return None
        return int(json.loads(markers[0].read_text())["step"])


def restore(manager: CheckpointManager) -> Restored | None:
    """Restore the step Ray Train last recorded, from the fastest tier; None on a fresh start.

    A rank killed right after reporting may not have persisted that step anywhere that survived it: then every
    rank restores the newest step before it that all of them hold (torch.distributed agrees on it).

    Raises:
        CorruptCheckpoint: the agreed step is in no tier in a verified, complete form.
    """
    step = reported_step()
    return None if step is None else manager.restore(at_most=step)
