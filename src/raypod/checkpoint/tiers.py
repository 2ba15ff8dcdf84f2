"""Where shards live: process memory, a peer node's memory (a Ray actor), and fsspec file systems (the node's
local disk, and durable storage such as S3). Each tier stores a shard as bytes plus a small manifest written
last; a shard without its manifest does not exist."""

from __future__ import annotations

import contextlib
import json
import logging
import mmap
import os
import threading
import zlib
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Protocol

import fsspec
import numpy as np
import torch
import xxhash

from raypod.checkpoint import format as fmt

log = logging.getLogger(__name__)


class Tier(Protocol):
    """One place a rank's checkpoints live. The manager knows tiers only through this protocol.

    ``steps`` lists the steps this rank can restore (for a ``shared`` tier: steps every rank completed); a
    tier that cannot be listed raises, it does not answer "nothing". ``put`` returns a local file holding the
    shard's bytes when it wrote one (later tiers may upload it instead of re-encoding). ``delete`` removes what
    this rank may remove of the steps before ``before``.
    """

    name: str
    shared: bool  # every rank writes its shard of a step here, and one rank (0) deletes for all

    def put(self, snapshot: Snapshot, rank: int, world_size: int, source: str | None = None) -> str | None: ...

    def steps(self, rank: int, world_size: int) -> list[int]: ...

    def get(self, step: int, rank: int, world_size: int) -> Any: ...

    def delete(self, before: int, rank: int, world_size: int) -> None: ...


def step_dir(step: int) -> str:
    return f"step-{step:012d}"


def shard_name(rank: int, world_size: int) -> str:
    return f"shard-{rank:05d}-of-{world_size:05d}"


@dataclass(eq=False)
class Snapshot:
    """One rank's copy of a step in process memory: preallocated tensors, reused for later steps of the same
    layout, so a save is one memory copy."""

    signature: tuple[tuple[str, tuple[int, ...]], ...]
    tensors: list[torch.Tensor]
    step: int = -1
    skeleton: Any = None
    metas: list[fmt.TensorMeta] = field(default_factory=list)
    complete: bool = False  # checksums computed: restorable
    busy: bool = False  # being persisted; not reusable yet

    def header(self, rank: int, world_size: int) -> bytes:
        return fmt.encode_header(self.step, rank, world_size, self.skeleton, self.metas)

    def verify(self, pool: Executor) -> None:
        """Raises CorruptCheckpoint: a tensor does not match its checksum."""
        bad: list[int] = []

        def check(index: int) -> None:
            if fmt.checksum(self.tensors[index]) != self.metas[index].checksum:
                bad.append(index)

        fmt.parallel(check, list(range(len(self.tensors))), pool)
        if bad:
            raise fmt.CorruptCheckpoint(f"memory tier: tensor {min(bad)} of step {self.step} is corrupt")


def signature(tensors: list[torch.Tensor]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    return tuple((str(t.dtype), tuple(t.shape)) for t in tensors)


class MemoryTier:
    """The newest ``keep`` complete snapshots of this process, plus one being written."""

    name = "memory"
    shared = False

    def __init__(self, keep: int, pool: Executor) -> None:
        self.keep = max(1, keep)
        self.pool = pool
        self.snapshots: list[Snapshot] = []
        self.lock = threading.Condition()

    def acquire(self, tensors: list[torch.Tensor], timeout: float | None = None) -> Snapshot:
        """A snapshot to copy into: a reusable one of the same layout, else a new allocation; waits while every
        spare one is still being persisted."""
        wanted = signature(tensors)
        with self.lock:
            while True:
                complete = sorted((s for s in self.snapshots if s.complete), key=lambda s: s.step)
                protected = {id(s) for s in complete[-self.keep :]}
                spare = [s for s in self.snapshots if not s.busy and id(s) not in protected]
                match = next((s for s in spare if s.signature == wanted), None)
                if match is not None:
                    match.complete, match.busy = False, True
                    return match
                if len(self.snapshots) < self.keep + 1 or spare:
                    for stale in spare:  # a layout that changed: free it
                        self.snapshots.remove(stale)
                    # Pinned host memory for accelerator tensors: their copies can then run asynchronously.
                    fresh = Snapshot(
                        wanted,
                        [torch.empty_like(t, device="cpu", pin_memory=t.device.type == "cuda") for t in tensors],
                        busy=True,
                    )
                    self.snapshots.append(fresh)
                    return fresh
                if not self.lock.wait(timeout):
                    raise TimeoutError("every memory snapshot is still being persisted")

    def release(self, snapshot: Snapshot) -> None:
        with self.lock:
            snapshot.busy = False
            self.lock.notify_all()

    def put(self, snapshot: Snapshot, rank: int, world_size: int, source: str | None = None) -> str | None:
        """The snapshot is already here: with its checksums computed, it becomes restorable."""
        with self.lock:
            snapshot.complete = True
        return None

    def steps(self, rank: int = 0, world_size: int = 1) -> list[int]:
        with self.lock:
            return sorted(s.step for s in self.snapshots if s.complete)[-self.keep :]

    def get(self, step: int, rank: int = 0, world_size: int = 1) -> Any:
        return self.take(step, self.pool)

    def delete(self, before: int, rank: int = 0, world_size: int = 1) -> None:
        """Older steps stop being restorable; their buffers stay, for the next save to copy into."""
        with self.lock:
            for old in self.snapshots:
                if old.complete and not old.busy and old.step < before:
                    old.complete = False
            self.lock.notify_all()

    def take(self, step: int, pool: Executor) -> Any:
        """The state of a step, verified, without a copy: the snapshot's tensors are handed to the caller and
        leave this tier (a later save allocates new ones).

        Raises:
            KeyError: not here. CorruptCheckpoint: it does not match its checksums.
        """
        with self.lock:
            found = next((s for s in self.snapshots if s.complete and s.step == step and not s.busy), None)
            if found is None:
                raise KeyError(step)
            found.busy = True
        try:
            found.verify(pool)
        except fmt.CorruptCheckpoint:
            self.release(found)
            raise
        with self.lock:
            self.snapshots.remove(found)
            self.lock.notify_all()
        return fmt.unflatten(found.skeleton, found.tensors)

    def corrupt(self, step: int) -> None:
        """Flip one byte of a stored snapshot (failure tests)."""
        found = next(s for s in self.snapshots if s.step == step)
        fmt.as_bytes(found.tensors[0])[0] ^= 0xFF


class FsspecTier:
    """Shards as files under a URL (``/local/dir``, ``file://``, ``s3://bucket/prefix``, ``gs://...``):
    ``<root>/<run>/step-N/shard-R-of-W.bin``, then its ``.json`` manifest, written last."""

    def __init__(
        self, name: str, url: str, run: str, storage_options: dict[str, Any] | None = None, *, shared: bool = False
    ) -> None:
        self.name = name
        self.shared = shared
        self.fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
        self.root = f"{root.rstrip('/')}/{run}"
        self.url = url
        protocols = self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)
        self.is_local = "file" in protocols

    def _paths(self, step: int, rank: int, world_size: int) -> tuple[str, str]:
        base = f"{self.root}/{step_dir(step)}/{shard_name(rank, world_size)}"
        return f"{base}.bin", f"{base}.json"

    def put(self, snapshot: Snapshot, rank: int, world_size: int, source: str | None = None) -> str | None:
        """Write a shard, then its manifest; return the shard's path when it is a local file. ``source``: a file
        already holding the shard's bytes (the local-disk tier's), uploaded instead of re-encoding."""
        path = self._write(snapshot, rank, world_size, source)
        return path if self.is_local else None

    def _write(self, snapshot: Snapshot, rank: int, world_size: int, local_copy: str | None) -> str:
        blob_path, manifest_path = self._paths(snapshot.step, rank, world_size)
        self.fs.makedirs(blob_path.rsplit("/", 1)[0], exist_ok=True)
        header = snapshot.header(rank, world_size)
        if local_copy is not None:
            self.fs.put_file(local_copy, blob_path)
        elif self.is_local:
            _write_local(blob_path, header, snapshot)
        else:
            with self.fs.open(blob_path, "wb", block_size=64 * 2**20) as out:
                out.write(header)
                for tensor, meta in zip(snapshot.tensors, snapshot.metas, strict=True):
                    out.write(fmt.as_bytes(tensor))
                    out.write(b"\0" * (-meta.nbytes % fmt.ALIGN))
        size = len(header) + sum(-(-m.nbytes // fmt.ALIGN) * fmt.ALIGN for m in snapshot.metas)
        manifest = {"step": snapshot.step, "rank": rank, "world_size": world_size, "bytes": size}
        _atomic_text(self.fs, manifest_path, json.dumps(manifest), self.is_local)
        return blob_path

    def stored_steps(self) -> list[int]:
        """Every step with a folder here, complete or not; none before the run's folder exists.

        Raises:
            OSError (and the file system's own errors): the listing failed; that is not "no steps".
        """
        try:
            entries = self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return []
        found = []
        for entry in entries:
            name = entry.rstrip("/").rsplit("/", 1)[-1]
            number = name.removeprefix("step-")
            if name.startswith("step-") and number.isdigit():
                found.append(int(number))
        return sorted(found)

    def steps(self, rank: int, world_size: int) -> list[int]:
        """Steps whose manifest is written: this rank's, or (a shared tier) every rank's."""
        ranks = range(world_size) if self.shared else (rank,)
        return [
            step
            for step in self.stored_steps()
            if all(self.fs.exists(self._paths(step, r, world_size)[1]) for r in ranks)
        ]

    def get(self, step: int, rank: int, world_size: int) -> Any:
        blob_path, manifest_path = self._paths(step, rank, world_size)
        manifest = json.loads(self.fs.cat_file(manifest_path))
        if self.is_local:
            # Map the file copy-on-write: tensors come straight from the page cache, and stay writable.
            with open(blob_path, "rb") as handle:
                if os.fstat(handle.fileno()).st_size != manifest["bytes"]:
                    raise fmt.CorruptCheckpoint(f"{self.name}: shard of step {step} has the wrong size")
                mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
            header, state = fmt.decode_shard(mapped, copy=False)
            if header["step"] != step or header["rank"] != rank:
                raise fmt.CorruptCheckpoint(f"{self.name}: shard of step {step} holds step {header['step']}")
            return state
        blob = bytearray(manifest["bytes"])  # read straight into one buffer the tensors will share
        with self.fs.open(blob_path, "rb", block_size=64 * 2**20) as source:
            view, read = memoryview(blob), 0
            while read < len(blob):
                chunk = source.readinto(view[read:])
                if not chunk:
                    raise fmt.CorruptCheckpoint(f"{self.name}: shard of step {step} is truncated")
                read += chunk
        header, state = fmt.decode_shard(blob, copy=False)
        if header["step"] != step or header["rank"] != rank:
            raise fmt.CorruptCheckpoint(f"{self.name}: shard of step {step} holds step {header['step']}")
        return state

    def delete(self, before: int, rank: int, world_size: int) -> None:
        """Delete the steps before ``before``. A shared tier deletes whole steps, incomplete ones too (a rank
        that died mid-upload left them; they can never be restored). Otherwise only this rank's shards go:
        ranks on one node share a local folder, and one rank running ahead must not delete what another needs.

        Raises:
            OSError: a listing or deletion failed (the caller logs and counts it; training goes on).
        """
        old = [step for step in self.stored_steps() if step < before]
        if self.shared:
            for step in old:
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm(f"{self.root}/{step_dir(step)}", recursive=True)
            return
        for step in old:
            blob_path, manifest_path = self._paths(step, rank, world_size)
            for path in (manifest_path, blob_path):  # manifest first: a half-deleted shard is never listed
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm_file(path)
            folder = f"{self.root}/{step_dir(step)}"
            with contextlib.suppress(FileNotFoundError):
                if not self.fs.ls(folder, detail=False):
                    self.fs.rmdir(folder)

    def corrupt(self, step: int, rank: int, world_size: int) -> None:
        """Flip a byte in the middle of a stored shard (failure tests)."""
        blob_path, _ = self._paths(step, rank, world_size)
        data = bytearray(self.fs.cat_file(blob_path))
        data[len(data) // 2] ^= 0xFF
        self.fs.pipe_file(blob_path, bytes(data))


def _write_local(path: str, header: bytes, snapshot: Snapshot) -> None:
    """Write a shard to local disk and fsync it before it may be renamed into place."""
    partial = f"{path}.partial"
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(descriptor, header)
        for tensor, meta in zip(snapshot.tensors, snapshot.metas, strict=True):
            view = fmt.as_bytes(tensor)
            while view:
                written = os.write(descriptor, view[: 64 * 2**20])
                view = view[written:]
            if meta.nbytes % fmt.ALIGN:
                os.write(descriptor, b"\0" * (-meta.nbytes % fmt.ALIGN))
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    os.replace(partial, path)


def _atomic_text(fs: Any, path: str, text: str, is_local: bool) -> None:
    if is_local:
        partial = f"{path}.partial"
        with open(partial, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, path)
    else:
        fs.pipe_file(path, text.encode())  # an object store PUT is all-or-nothing


class PeerTier:
    """A replica of this rank's newest snapshots in the memory of a Ray actor on another node, so losing this
    node (and its memory and disk) loses no checkpoint the peer has."""

    name = "peer"
    shared = False

    def __init__(self, run: str, rank: int, keep: int) -> None:
        import ray

        self.ray = ray
        self.actor_name = f"raypod-ckpt-{run}-{rank}"
        self.keep = keep
        self._actor: Any = None

    def _handle(self, create: bool) -> Any:
        if self._actor is not None:
            return self._actor
        ray = self.ray
        try:
            self._actor = ray.get_actor(self.actor_name, namespace=PEER_NAMESPACE)
            return self._actor
        except ValueError:
            if not create:
                raise KeyError(self.actor_name) from None
        here = ray.get_runtime_context().get_node_id()
        others = sorted(node["NodeID"] for node in ray.nodes() if node["Alive"] and node["NodeID"] != here)
        if not others:
            raise RuntimeError("no other alive node to hold a peer replica")
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        peer_node = others[zlib.crc32(self.actor_name.encode()) % len(others)]  # the same in every process
        self._actor = (
            ray.remote(num_cpus=0, max_restarts=0)(PeerReplica)
            .options(
                name=self.actor_name,
                namespace=PEER_NAMESPACE,
                lifetime="detached",
                get_if_exists=True,
                scheduling_strategy=NodeAffinitySchedulingStrategy(peer_node, soft=False),
            )
            .remote(self.keep)
        )
        return self._actor

    def put(self, snapshot: Snapshot, rank: int, world_size: int, source: str | None = None) -> str | None:
        arrays = [tensor.reshape(-1).view(torch.uint8).numpy() for tensor in snapshot.tensors]
        actor = self._handle(create=True)
        self.ray.get(actor.put.remote(snapshot.step, snapshot.header(rank, world_size), arrays))
        return None

    def steps(self, rank: int = 0, world_size: int = 1) -> list[int]:
        """Steps the replica holds; none when there is no replica (yet, or any more).

        Raises:
            The replica's error when it exists but cannot answer (e.g. its node died).
        """
        try:
            steps: list[int] = self.ray.get(self._handle(create=False).steps.remote(), timeout=30)
        except KeyError:
            return []
        except Exception:
            self._actor = None
            raise
        return steps

    def delete(self, before: int, rank: int = 0, world_size: int = 1) -> None:
        """The replica keeps its newest ``keep`` steps itself."""

    def get(self, step: int, rank: int = 0, world_size: int = 1) -> Any:
        header_bytes, arrays = self.ray.get(self._handle(create=False).get.remote(step), timeout=300)
        header, _ = fmt.decode_header(header_bytes)
        tensors = []
        for index, (meta, array) in enumerate(zip(header["tensors"], arrays, strict=True)):
            if xxhash.xxh3_64_intdigest(memoryview(array)) != meta["checksum"]:
                raise fmt.CorruptCheckpoint(f"peer tier: tensor {index} of step {step} is corrupt")
            raw = torch.from_numpy(np.array(array, copy=True))
            tensors.append(raw.view(fmt.dtype_of(meta["dtype"])).reshape(meta["shape"]))
        return fmt.unflatten(header["skeleton"], tensors)

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.ray.kill(self._handle(create=False))
        self._actor = None


PEER_NAMESPACE = "raypod-checkpoint"


class PeerReplica:
    """The Ray actor behind PeerTier: keeps the newest ``keep`` shards it was sent."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.shards: dict[int, tuple[bytes, list[np.ndarray]]] = {}

    def put(self, step: int, header: bytes, arrays: list[np.ndarray]) -> None:
        self.shards[step] = (header, [np.array(a, copy=True) for a in arrays])
        for old in sorted(self.shards)[: -self.keep]:
            del self.shards[old]

    def steps(self) -> list[int]:
        return sorted(self.shards)

    def get(self, step: int) -> tuple[bytes, list[np.ndarray]]:
        return self.shards[step]
