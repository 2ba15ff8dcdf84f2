"""Tiered checkpoints for training: a consistent snapshot in memory in milliseconds; local disk, a peer node's
memory and durable storage (any fsspec URL) written in the background; restore from the fastest tier that
holds a verified, complete copy.

    from raypod.checkpoint import CheckpointManager

    manager = CheckpointManager("run-1", local_dir="/tmp/ckpt", durable_url="s3://bucket/ckpt")
    manager.save({"model": model.state_dict(), "optim": optim.state_dict(), "step": step}, step)
    restored = manager.restore()          # Restored(step, tier, state, seconds) or None

Integrations: ``raypod.checkpoint.dcp`` (PyTorch Distributed Checkpoint storage) and
``raypod.checkpoint.ray_train`` (Ray Train helpers). This package imports only torch, fsspec, xxhash and, for
the peer tier, Ray: it runs inside training processes.
"""

from raypod.checkpoint.format import CheckpointNotFound, CorruptCheckpoint
from raypod.checkpoint.manager import CheckpointManager, Restored, Retention, Saved

__all__ = ["CheckpointManager", "CheckpointNotFound", "CorruptCheckpoint", "Restored", "Retention", "Saved"]
