"""A tiered cache of attention keys and values, so a prompt that repeats a known prefix (the earlier turns of a
chat, a long document asked about again) computes only what follows it.

A prompt is cut into chunks of ``chunk_tokens`` tokens; chunk *i* is keyed by a hash chained over chunks 0..i, the
model id and the dtype, so a key names a whole prefix and two models never share entries. A lookup takes the
longest run of cached chunks from the start; only the rest is computed.

- **L1**: the node's memory. Inside Ray, one actor per node (``NodeL1``) keeps an LRU index, by bytes, of chunks held
  in the node's Ray object store: preallocated shared memory, read without a copy by every replica on the node.
  Outside Ray, ``ProcessL1`` is the same index over this process's memory.
- **L2**: shared across nodes and replicas: Redis (``redis://``) or any fsspec URL (``s3://``, ``file://``)
  (``kvcache_l2``).
  Entries carry a checksum; a corrupt one is skipped (and recomputed), never served.

Writes go to a background thread with a bounded queue: a store never delays an answer, and a full queue drops the
write (counted) instead of blocking. An unreachable L2 leaves L1 working, with a warning and a metric.

Adopt it in an own deployment in a few lines::

    cache = KVCache(KVCacheConfig(model_id="my-model", l2_url="redis://host:6379/0"))
    prefix = cache.lookup(token_ids)          # prefix.tokens are cached; prefix.layers() gives (keys, values)
    ...                                       # compute token_ids[prefix.tokens:] on top of it
    cache.promote(prefix)                     # after the answer: what L2 served, into L1
    cache.store(token_ids, layer_tensors)     # in the background: every full chunk not yet cached
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import queue
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from raypod.serving.kvcache_l2 import ALIGN, L2, Staging, open_l2

log = logging.getLogger(__name__)

MAGIC = b"RPKV1"
ENTRY_HEADER_ROOM = 512  # an entry's bytes before its array (padded to ALIGN), and its alignment in a buffer
DEFAULT_CHUNK_TOKENS = 256
L1_ACTOR_PREFIX = "raypod-kv-l1-"
L1_NAMESPACE = "raypod"


class CorruptEntry(ValueError):
    """An L2 entry whose checksum, header or size does not match."""


@dataclass(frozen=True)
class KVCacheConfig:
    model_id: str
    dtype: str = "float32"
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    l1_bytes: int = 2 * 2**30
    l2_url: str | None = None
    l2_timeout_s: float = 2.0
    write_queue: int = 32
    l1: str = "node"  # "node": shared by the node's replicas through Ray; "process": this process only; "off"

    def __post_init__(self) -> None:
        if not 16 <= self.chunk_tokens <= 8192:
            raise ValueError(f"chunk_tokens must be between 16 and 8192, not {self.chunk_tokens}")
        if self.l1_bytes < 0:
            raise ValueError("l1_bytes must not be negative")
        if self.l1 not in ("node", "process", "off"):
            raise ValueError(f"l1 must be 'node', 'process' or 'off', not {self.l1!r}")


def chunk_keys(model_id: str, dtype: str, tokens: Sequence[int], chunk_tokens: int) -> list[str]:
    """One key per full chunk, each chained over every chunk before it."""
    digest = hashlib.sha256(f"{model_id}\0{dtype}\0{chunk_tokens}".encode()).digest()
    keys = []
    for start in range(0, len(tokens) - chunk_tokens + 1, chunk_tokens):
        chunk = np.asarray(tokens[start : start + chunk_tokens], dtype=np.int64).tobytes()
        digest = hashlib.sha256(digest + chunk).digest()
        keys.append(digest.hex())
    return keys


def encode(array: np.ndarray) -> bytes:
    """One copy of the array: its bytes after a header padded so that they start ``ALIGN``-aligned in the entry,
    and in a reader's buffer that holds the entry at an aligned offset."""
    import xxhash

    payload = np.ascontiguousarray(array).data.cast("B")
    header = json.dumps(
        {"dtype": str(array.dtype), "shape": list(array.shape), "xxh3": xxhash.xxh3_64_hexdigest(payload)}
    ).encode()
    header += b" " * (-(len(MAGIC) + 4 + len(header)) % ALIGN)
    return b"".join((MAGIC, struct.pack("<I", len(header)), header, payload))


def decode(blob: bytes | memoryview) -> np.ndarray:
    """Raises CorruptEntry."""
    import xxhash

    view = memoryview(blob)
    if bytes(view[: len(MAGIC)]) != MAGIC or len(view) < len(MAGIC) + 4:
        raise CorruptEntry("not a KV cache entry")
    (size,) = struct.unpack("<I", view[len(MAGIC) : len(MAGIC) + 4])
    start = len(MAGIC) + 4
    try:
        header = json.loads(bytes(view[start : start + size]))
        dtype, shape, checksum = np.dtype(header["dtype"]), tuple(header["shape"]), header["xxh3"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptEntry(f"unreadable header ({exc})") from None
    payload = view[start + size :]
    if len(payload) != int(np.prod(shape)) * dtype.itemsize or xxhash.xxh3_64_hexdigest(payload) != checksum:
        raise CorruptEntry("checksum or size mismatch")
    return np.frombuffer(payload, dtype=dtype).reshape(shape)


# -- tiers ---------------------------------------------------------------------------------------------------


class L1(Protocol):
    def longest(self, keys: list[str]) -> list[np.ndarray]: ...

    def put(self, key: str, array: np.ndarray) -> None:
        """Keeps a copy, never ``array`` itself: it may lie in a buffer that is reused."""
        ...

    def used_bytes(self) -> int: ...


class _LruIndex:
    """Keys to values, least recently used first, evicted by bytes: a full L1 evicts, it never refuses."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity = capacity_bytes
        self.used = 0
        self.entries: OrderedDict[str, tuple[Any, int]] = OrderedDict()
        self.lock = threading.Lock()

    def longest(self, keys: list[str]) -> list[Any]:
        found = []
        with self.lock:
            for key in keys:
                entry = self.entries.get(key)
                if entry is None:
                    break
                self.entries.move_to_end(key)
                found.append(entry[0])
        return found

    def put(self, key: str, value: Any, size: int) -> bool:
        if size > self.capacity:
            return False
        with self.lock:
            if key in self.entries:
                self.entries.move_to_end(key)
                return True
            while self.used + size > self.capacity and self.entries:
                _, (_, evicted) = self.entries.popitem(last=False)
                self.used -= evicted
            self.entries[key] = (value, size)
            self.used += size
        return True


class ProcessL1:
    def __init__(self, capacity_bytes: int) -> None:
        self.index = _LruIndex(capacity_bytes)

    def longest(self, keys: list[str]) -> list[np.ndarray]:
        return self.index.longest(keys)

    def put(self, key: str, array: np.ndarray) -> None:
        self.index.put(key, array.copy(), array.nbytes)

    def used_bytes(self) -> int:
        return self.index.used


class NodeL1Store:
    """The body of the per-node actor: an LRU index, by bytes, of chunks it put into the node's object store
    itself, so they are owned by it and outlive the replica that computed them (Ray 2.56 removed ``ray.put``'s
    ``_owner``: a replica cannot put them there on the actor's behalf)."""

    def __init__(self, capacity_bytes: int) -> None:
        self.index = _LruIndex(capacity_bytes)

    def longest(self, keys: list[str]) -> list[Any]:
        return self.index.longest(keys)

    def put(self, key: str, array: np.ndarray) -> bool:
        import ray

        if self.index.longest([key]):
            return True
        return self.index.put(key, ray.put(array), array.nbytes)

    def resize(self, capacity_bytes: int) -> None:
        self.index.capacity = max(self.index.capacity, capacity_bytes)

    def used_bytes(self) -> int:
        return self.index.used


class NodeL1:
    """The node's L1 from a replica: one actor per node (created by the first replica there, found by the others)."""

    def __init__(self, capacity_bytes: int) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        node_id = ray.get_runtime_context().get_node_id()
        actor_class: Any = ray.remote(NodeL1Store)
        self.actor = actor_class.options(
            num_cpus=0,
            max_concurrency=16,
            name=L1_ACTOR_PREFIX + node_id,
            namespace=L1_NAMESPACE,
            get_if_exists=True,
            lifetime="detached",
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        ).remote(capacity_bytes)
        self.actor.resize.remote(capacity_bytes)
        self._ray = ray

    def longest(self, keys: list[str]) -> list[np.ndarray]:
        refs = self._ray.get(self.actor.longest.remote(keys))
        return list(self._ray.get(refs)) if refs else []

    def put(self, key: str, array: np.ndarray) -> None:
        self._ray.get(self.actor.put.remote(key, array))

    def used_bytes(self) -> int:
        return int(self._ray.get(self.actor.used_bytes.remote()))


# -- the cache -----------------------------------------------------------------------------------------------


@dataclass
class Prefix:
    """The cached start of a prompt: ``tokens`` tokens in ``chunks`` of shape (layers, 2, kv_heads, chunk, dim)."""

    tokens: int = 0
    chunks: list[np.ndarray] = field(default_factory=list)
    tiers: dict[str, int] = field(default_factory=dict)  # chunks found per tier
    from_l2: list[str] = field(default_factory=list)  # keys of the chunks L2 served: ``promote`` copies them to L1
    seconds: dict[str, float] = field(default_factory=dict)  # where the lookup's time went (a diagnosis)
    staging: Staging | None = None  # the buffer L2's chunks lie in, lent until ``promote``

    def layers(self) -> list[tuple[Any, Any]]:
        """Per layer, keys and values of the whole prefix as torch tensors of shape (1, kv_heads, tokens, dim)."""
        import torch

        if not self.chunks:
            return []
        with warnings_suppressed():
            tensors = [torch.from_numpy(chunk) for chunk in self.chunks]
        joined = torch.cat(tensors, dim=3)  # (layers, 2, heads, tokens, dim)
        return [(joined[i, 0].unsqueeze(0), joined[i, 1].unsqueeze(0)) for i in range(joined.shape[0])]


@contextlib.contextmanager
def warnings_suppressed() -> Any:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # read-only shared memory: torch warns, and nothing writes to it
        yield


@dataclass
class _Write:
    keys: list[str]
    arrays: list[np.ndarray]  # the chunks themselves, or empty: cut them from ``layers`` in the background
    layers: list[tuple[Any, Any]]
    first: int  # the chunk index of keys[0]
    to_l2: bool
    staging: Staging | None = None  # what ``arrays`` lie in: given back to the cache once written


Metric = Callable[[str, float, dict[str, str]], None]


def _no_metric(name: str, value: float, tags: dict[str, str]) -> None:
    return None


class KVCache:
    def __init__(
        self, config: KVCacheConfig, *, l1: L1 | None = None, l2: L2 | None = None, metric: Metric | None = None
    ) -> None:
        self.config = config
        self.metric = metric or _no_metric
        self.l1: L1 | None = l1
        if l1 is None and config.l1 != "off" and config.l1_bytes:
            self.l1 = NodeL1(config.l1_bytes) if config.l1 == "node" else ProcessL1(config.l1_bytes)
        self.l2: L2 | None = l2
        if l2 is None and config.l2_url:
            try:
                self.l2 = open_l2(config.l2_url, config.l2_timeout_s)
            except Exception as exc:  # an unusable L2 must not stop serving
                self._l2_failed("open", exc)
        self.l2_down_until = 0.0
        self._staging: Staging | None = Staging()
        self._staging_lock = threading.Lock()
        self._writes: queue.Queue[_Write | None] = queue.Queue(config.write_queue)
        self._writer = threading.Thread(target=self._write_loop, name="raypod-kv-writer", daemon=True)
        self._writer.start()

    def keys(self, tokens: Sequence[int]) -> list[str]:
        return chunk_keys(self.config.model_id, self.config.dtype, tokens, self.config.chunk_tokens)

    def lookup(self, tokens: Sequence[int]) -> Prefix:
        """The longest cached prefix that leaves at least the last token to compute (its logits are the answer)."""
        keys = self.keys(tokens[:-1])
        prefix = Prefix()
        if not keys:
            return prefix
        if self.l1 is not None:
            try:
                prefix.chunks = self.l1.longest(keys)
            except Exception as exc:  # the node's L1 actor restarting: a miss, not a failure
                log.warning("KV cache L1 lookup failed: %s", exc)
            prefix.tiers["l1"] = len(prefix.chunks)
        rest = keys[len(prefix.chunks) :]
        if rest and self.l2 is not None and time.monotonic() >= self.l2_down_until:
            staging = self._take_staging()
            found = self._l2_get(rest, staging, prefix.seconds)
            prefix.tiers["l2"] = len(found)
            if found:
                prefix.chunks.extend(found)
                prefix.from_l2 = rest[: len(found)]
                prefix.staging = staging
            else:
                self._give_back(staging)
        prefix.tokens = len(prefix.chunks) * self.config.chunk_tokens
        for tier, count in prefix.tiers.items():
            if count:
                self.metric("kv_cache_hit_chunks", count, {"tier": tier})
        missed = len(keys) - len(prefix.chunks)
        if missed:
            self.metric("kv_cache_miss_chunks", missed, {})
        return prefix

    def store(
        self,
        tokens: Sequence[int],
        layers: Sequence[tuple[Any, Any]],
        cached_chunks: int = 0,
        *,
        snapshot: bool = False,
    ) -> None:
        """Queue every full chunk of ``tokens`` past the first ``cached_chunks`` (already cached) for L1 and L2.

        ``layers`` are per-layer (keys, values) tensors of shape (1, kv_heads, >= len(tokens), dim). Without
        ``snapshot`` they are read later, in the background, so they must not be modified in place afterwards
        (transformers' default cache grows by concatenation, which leaves them alone); with it the chunks are
        copied out now, and the caller may reuse the tensors at once.
        """
        keys = self.keys(tokens)[cached_chunks:]
        if not keys:
            return
        if snapshot:
            arrays = [self._chunk_of(list(layers), cached_chunks + i) for i in range(len(keys))]
            self._enqueue(_Write(keys, arrays, [], cached_chunks, to_l2=True))
        else:
            self._enqueue(_Write(keys, [], list(layers), cached_chunks, to_l2=True))

    def promote(self, prefix: Prefix) -> None:
        """Queue the chunks L2 served into L1, so the next request on this node finds them there, and end the
        prefix's loan of the read buffer (its chunks must not be used afterwards). Called after the answer: the
        copy would otherwise compete with the request for the cores."""
        staging, prefix.staging = prefix.staging, None
        if prefix.from_l2 and self.l1 is not None:
            found = prefix.chunks[len(prefix.chunks) - len(prefix.from_l2) :]
            if self._enqueue(_Write(list(prefix.from_l2), found, [], 0, to_l2=False, staging=staging)):
                staging = None  # the writer gives it back
        prefix.from_l2 = []
        if staging is not None:
            self._give_back(staging)

    def reserve_read_buffer(self, tokens: int, bytes_per_token: int) -> None:
        """Make the buffer L2 reads land in ready for a prefix of ``tokens`` (a serving engine's start)."""
        if self.l2 is None or tokens <= 0:
            return
        chunks = -(-tokens // self.config.chunk_tokens)
        per_chunk = self.config.chunk_tokens * bytes_per_token + ENTRY_HEADER_ROOM
        with self._staging_lock:
            if self._staging is not None:
                self._staging.reserve(chunks * per_chunk)

    def pending_writes(self) -> int:
        return self._writes.unfinished_tasks

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until queued writes are done (tests, benchmarks, shutdown)."""
        deadline = time.monotonic() + timeout_s
        while self._writes.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)

    def close(self) -> None:
        self.flush(5.0)
        with contextlib.suppress(queue.Full):
            self._writes.put_nowait(None)

    # -- internals ---------------------------------------------------------------------------------------

    def _enqueue(self, write: _Write) -> bool:
        try:
            self._writes.put_nowait(write)
        except queue.Full:
            self.metric("kv_cache_dropped_writes", len(write.keys), {})
            return False
        return True

    def _take_staging(self) -> Staging:
        """The cache's read buffer, or a new one while a prefix or a write still holds it."""
        with self._staging_lock:
            staging, self._staging = self._staging, None
        if staging is None:
            staging = Staging()
        staging.reset()
        return staging

    def _give_back(self, staging: Staging) -> None:
        with self._staging_lock:
            if self._staging is None or len(staging.buffer) > len(self._staging.buffer):
                self._staging = staging

    def _write_loop(self) -> None:
        while True:
            write = self._writes.get()
            try:
                if write is None:
                    return
                arrays = write.arrays or [self._chunk_of(write.layers, write.first + i) for i in range(len(write.keys))]
                for key, array in zip(write.keys, arrays, strict=True):
                    self._write_one(key, array, write_l2=write.to_l2)
            except Exception as exc:
                log.warning("KV cache write failed: %s", exc)
            finally:
                if write is not None and write.staging is not None:
                    self._give_back(write.staging)
                self._writes.task_done()

    def _chunk_of(self, layers: list[tuple[Any, Any]], index: int) -> np.ndarray:
        import torch

        size = self.config.chunk_tokens
        window = slice(index * size, (index + 1) * size)
        stacked = torch.stack([torch.stack([k[0, :, window], v[0, :, window]]) for k, v in layers])
        return stacked.contiguous().numpy()

    def _write_one(self, key: str, array: np.ndarray, write_l2: bool) -> None:
        if self.l1 is not None:
            try:
                self.l1.put(key, array)
            except Exception as exc:
                log.warning("KV cache L1 write failed: %s", exc)
        if write_l2 and self.l2 is not None and time.monotonic() >= self.l2_down_until:
            try:
                self.l2.put(key, encode(array))
                self.metric("kv_cache_l2_written_bytes", array.nbytes, {})
            except Exception as exc:
                self._l2_failed("write", exc)
        if self.l1 is not None:
            with contextlib.suppress(Exception):
                self.metric("kv_cache_l1_used_bytes", self.l1.used_bytes(), {"gauge": "1"})

    def _l2_get(self, keys: list[str], staging: Staging, seconds: dict[str, float]) -> list[np.ndarray]:
        started, cpu = time.perf_counter(), time.thread_time()
        try:
            blobs = self.l2.get_many(keys, staging) if self.l2 is not None else []
        except Exception as exc:
            self._l2_failed("read", exc)
            return []
        read = time.perf_counter()
        seconds["l2_read"], seconds["l2_read_cpu"] = read - started, time.thread_time() - cpu
        found = []
        for key, blob in zip(keys, blobs, strict=False):  # a tier may stop at its first miss
            if blob is None:
                break
            try:
                found.append(decode(blob))
            except CorruptEntry as exc:
                log.warning("KV cache L2 entry %s is corrupt (%s): recomputing it", key[:12], exc)
                self.metric("kv_cache_corrupt_entries", 1, {})
                break
        seconds["l2_verify"] = time.perf_counter() - read
        return found

    def _l2_failed(self, operation: str, exc: Exception) -> None:
        """Degrade to L1 for a while; the next try after the pause finds out whether L2 is back."""
        self.l2_down_until = time.monotonic() + 10.0
        self.metric("kv_cache_l2_errors", 1, {"operation": operation})
        log.warning("KV cache L2 (%s) failed on %s, serving from L1 only for 10 s: %s", self._l2_name(), operation, exc)

    def _l2_name(self) -> str:
        url = self.config.l2_url or ""
        return url.split("@")[-1] if "@" in url else url  # never the password
