"""CheckpointManager: ``save`` snapshots into memory and returns; one background thread checksums the snapshot,
then replicates and persists it tier by tier; ``restore`` loads the newest complete step from the fastest tier
that holds a verified copy."""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from raypod import hangwatch
from raypod.checkpoint import format as fmt
from raypod.checkpoint import tiers

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Retention:
    """How many complete steps each tier keeps (older ones are deleted once a newer one is complete)."""

    memory: int = 2
    peer: int = 2
    disk: int = 3
    durable: int = 5

    def __post_init__(self) -> None:
        for tier, keep in vars(self).items():
            if not isinstance(keep, int) or keep < 1:
                raise ValueError(f"Retention.{tier} must be a whole number of steps, at least 1 (got {keep!r})")


DEFAULT_RETENTION = Retention()


@dataclass(frozen=True)
class Saved:
    step: int
    stall_s: float  # how long save() blocked the caller
    done: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until this step is persisted in every tier (or failed there); return whether it was."""
        return self.done.wait(timeout)


@dataclass(frozen=True)
class Restored:
    step: int
    tier: str
    state: Any
    seconds: float
    skipped: dict[str, str] = field(default_factory=dict)  # tier -> why it was not used


class CheckpointManager:
    """Tiered checkpoints of one rank of a run.

    Args:
        run: names the run in every tier (a directory, a peer actor).
        local_dir: the node's local-disk tier (``None``: none).
        durable_url: any fsspec URL (``s3://bucket/prefix``, ``gs://...``, ``file:///...``; ``None``: none).
        rank, world_size: this process' shard; a step is complete only when every rank's shard is.
        peer: keep a replica in an actor on another Ray node (needs a running Ray with another node).
        storage_options: fsspec options of the durable tier (endpoint, credentials).
        agree: given this rank's restorable steps, return the step every rank restores (sharded runs; the
            default uses torch.distributed when it is initialized).
    """

    def __init__(
        self,
        run: str,
        local_dir: str | Path | None = None,
        durable_url: str | None = None,
        *,
        rank: int = 0,
        world_size: int = 1,
        retention: Retention = DEFAULT_RETENTION,
        peer: bool = False,
        storage_options: dict[str, Any] | None = None,
        agree: Callable[[set[int]], int | None] | None = None,
    ) -> None:
        self.run, self.rank, self.world_size, self.retention = run, rank, world_size, retention
        self._threads = fmt.copy_threads()
        self._workers = ThreadPoolExecutor(self._threads, thread_name_prefix="raypod-ckpt-copy")
        self.memory = tiers.MemoryTier(retention.memory, self._workers)
        self.peer = tiers.PeerTier(run, rank, retention.peer) if peer else None
        self.disk = tiers.FsspecTier("disk", str(local_dir), run) if local_dir is not None else None
        self.durable = (
            tiers.FsspecTier("durable", durable_url, run, storage_options, shared=True)
            if durable_url is not None
            else None
        )
        # Fastest first: restore tries them in this order, persisting writes them in this order.
        self.tiers: list[tiers.Tier] = [t for t in (self.memory, self.peer, self.disk, self.durable) if t is not None]
        self._keep = {"memory": retention.memory, "peer": retention.peer, "disk": retention.disk}
        self._keep["durable"] = retention.durable
        self.agree = agree or _agree
        self.errors: dict[str, str] = {}  # tier -> last error, for callers and metrics
        self.persisted: dict[str, int] = {}  # tier -> newest step written there
        self.retention_failures: dict[str, int] = {}  # tier -> deletions of old steps that failed
        self._queue: queue.Queue[tuple[tiers.Snapshot, threading.Event] | None] = queue.Queue()
        self._idle = threading.Condition()
        self._pending = 0
        self._thread = threading.Thread(target=self._persist_loop, name=f"raypod-ckpt-{run}-{rank}", daemon=True)
        self._thread.start()

    # -- save --------------------------------------------------------------------------------------------------

    def save(self, state: Any, step: int) -> Saved:
        """Snapshot ``state`` into memory and return; persisting happens in the background.

        Tensors on an accelerator are copied to host memory before this returns; training may change them
        right after.
        """
        with hangwatch.paused("checkpoint save"):
            return self._save(state, step)

    def _save(self, state: Any, step: int) -> Saved:
        started = time.perf_counter()
        skeleton, tensors = fmt.flatten(state)
        snapshot = self.memory.acquire(tensors)
        pairs = list(zip(snapshot.tensors, tensors, strict=True))
        if any(t.device.type != "cpu" for t in tensors):
            for target, source in pairs:
                target.copy_(source.detach(), non_blocking=True)
            torch.cuda.synchronize()
        else:
            fmt.parallel(lambda pair: pair[0].copy_(pair[1].detach()), pairs, self._workers, self._threads)
        snapshot.step, snapshot.skeleton = step, skeleton
        saved = Saved(step, time.perf_counter() - started)
        with self._idle:
            self._pending += 1
        self._queue.put((snapshot, saved.done))
        return saved

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every save so far is persisted in every tier (or failed there); return whether it was."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with hangwatch.paused("checkpoint upload"), self._idle:
            while self._pending:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._idle.wait(remaining)
        return True

    def close(self) -> None:
        """Finish persisting, then stop the background thread (the peer replica stays for a restarted rank)."""
        self.wait()
        self._queue.put(None)
        self._thread.join(timeout=60)
        self._workers.shutdown()

    def drop_peer(self) -> None:
        """End the peer replica actor (it is detached, so that it outlives a failed rank): call at the run's end."""
        if self.peer is not None:
            self.peer.kill()

    def _persist_loop(self) -> None:
        # Persisting is background work: at the lowest CPU priority, training threads win the cores.
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        while (item := self._queue.get()) is not None:
            snapshot, done = item
            try:
                self._persist(snapshot)
            except Exception:
                log.exception("checkpoint step %s: persisting failed", snapshot.step)
            finally:
                self.memory.release(snapshot)
                done.set()
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()

    def _persist(self, snapshot: tiers.Snapshot) -> None:
        metas = fmt.layout(snapshot.tensors)
        snapshot.metas = [
            fmt.TensorMeta(m.dtype, m.shape, m.offset, m.nbytes, fmt.checksum(t))
            for m, t in zip(metas, snapshot.tensors, strict=True)
        ]
        local_copy: str | None = None
        for tier in self.tiers:
            written = self._try(tier, snapshot, local_copy)
            if written is None:
                continue
            local_copy = written or local_copy
            self._retain(tier)

    def _try(self, tier: tiers.Tier, snapshot: tiers.Snapshot, source: str | None) -> str | None:
        """Write to one tier; a failure is logged and remembered, and the other tiers go on.

        Returns the local copy the tier made ("" for none), or None when it failed."""
        try:
            path = tier.put(snapshot, self.rank, self.world_size, source)
        except Exception as exc:
            message = f"{type(exc).__name__}: {exc}"
            if self.errors.get(tier.name) != message:
                log.warning(
                    "checkpoint tier %s failed at step %s (%s); the other tiers go on",
                    tier.name,
                    snapshot.step,
                    message,
                )
            self.errors[tier.name] = message
            return None
        self.errors.pop(tier.name, None)
        self.persisted[tier.name] = snapshot.step
        return path or ""

    def _retain(self, tier: tiers.Tier) -> None:
        """Delete steps older than the newest ``keep`` complete ones. In a shared tier rank 0 alone lists and
        deletes (no listing of shared storage on every rank's save). A failure is logged and counted."""
        if tier.shared and self.rank != 0:
            return
        try:
            complete = tier.steps(self.rank, self.world_size)
            keep = self._keep[tier.name]
            if len(complete) > keep:
                tier.delete(complete[-keep], self.rank, self.world_size)
        except Exception as exc:
            self.retention_failures[tier.name] = self.retention_failures.get(tier.name, 0) + 1
            log.warning(
                "checkpoint tier %s: deleting old steps failed (%s: %s; %d failure(s) so far)",
                tier.name,
                type(exc).__name__,
                exc,
                self.retention_failures[tier.name],
            )

    # -- restore -----------------------------------------------------------------------------------------------

    def available(self, unlisted: dict[str, str] | None = None) -> dict[str, list[int]]:
        """Steps each tier holds a complete copy of, for this rank (every rank's, for the durable tier).

        A tier that cannot be listed is left out and, when ``unlisted`` is given, named there with the error.
        """
        found: dict[str, list[int]] = {}
        for tier in self.tiers:
            try:
                found[tier.name] = tier.steps(self.rank, self.world_size)
            except Exception as exc:
                reason = f"cannot list it: {type(exc).__name__}: {exc}"
                log.warning("checkpoint tier %s: %s", tier.name, reason)
                if unlisted is not None:
                    unlisted[tier.name] = reason
        return found

    def restore(self, step: int | None = None, at_most: int | None = None) -> Restored | None:
        """Load the newest complete step (or ``step``, or the newest up to ``at_most``) from the fastest tier
        with a verified copy; a corrupt or unreadable copy is skipped with a warning. ``None`` when no tier
        holds one.

        Raises:
            CheckpointNotFound: ``step`` is in no tier.
            CorruptCheckpoint: the chosen step is corrupt or unreadable in every tier that holds it.
        """
        started = time.perf_counter()
        skipped: dict[str, str] = {}
        available = self.available(skipped)
        if step is None:
            candidates = {s for steps in available.values() for s in steps}
            step = self.agree({s for s in candidates if at_most is None or s <= at_most})
            if step is None:
                return None
        if not any(step in steps for steps in available.values()):
            raise fmt.CheckpointNotFound(f"step {step} is in no tier (they hold: {available}; {skipped or ''})")
        for tier in self.tiers:
            if step not in available.get(tier.name, []):
                continue
            try:
                state = tier.get(step, self.rank, self.world_size)
            except Exception as exc:
                skipped[tier.name] = f"{type(exc).__name__}: {exc}"
                log.warning("checkpoint step %s: skipping the %s tier (%s)", step, tier.name, skipped[tier.name])
                continue
            return Restored(step, tier.name, state, time.perf_counter() - started, skipped)
        raise fmt.CorruptCheckpoint(f"step {step} could not be restored from any tier: {skipped or available}")


def _agree(steps: set[int]) -> int | None:
    """The newest step every rank can restore: the intersection over ranks when torch.distributed runs."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        gathered: list[set[int] | None] = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(gathered, steps)
        common = set.intersection(*(s or set() for s in gathered))
        return max(common) if common else None
    return max(steps) if steps else None
