"""How a rank's shard of a checkpoint is laid out, in memory and in files. No pickle: a checkpoint read back
from shared storage cannot run code.

A state is any nesting of dicts, lists and tuples whose leaves are tensors or JSON scalars (a model or
optimizer ``state_dict``, a step counter, an RNG state tensor). It flattens into a *skeleton* (JSON, tensors
replaced by ``{"__tensor__": i}``) and a list of tensors. A shard file is::

    MAGIC | 8-byte little-endian header length | header JSON | padding | tensor bytes (64-byte aligned each)

The header holds the skeleton and, per tensor, dtype, shape, offset, size and an xxh3-64 checksum.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import xxhash

T = TypeVar("T")
Buffer = memoryview | bytes | bytearray | mmap.mmap
MAGIC = b"RAYPODCK1\n"
ALIGN = 64
HEADER_KEYS = frozenset({"step", "rank", "world_size", "skeleton", "tensors"})

_DTYPES = {
    str(dtype).removeprefix("torch."): dtype
    for dtype in (
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
        torch.complex64,
        torch.complex128,
    )
}


class CorruptCheckpoint(ValueError):
    """A shard whose bytes do not match its checksums, or that is not a raypod shard at all."""


class CheckpointNotFound(LookupError):
    """No tier holds the step asked for."""


@dataclass(frozen=True)
class TensorMeta:
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    checksum: int | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "dtype": self.dtype,
            "shape": list(self.shape),
            "offset": self.offset,
            "nbytes": self.nbytes,
            "checksum": self.checksum,
        }


def flatten(state: Any) -> tuple[Any, list[torch.Tensor]]:
    """Split a state into its JSON skeleton and its tensors, in a deterministic order."""
    tensors: list[torch.Tensor] = []

    def walk(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            tensors.append(value)
            return {"__tensor__": len(tensors) - 1}
        if isinstance(value, dict):
            if all(isinstance(key, str) and not key.startswith("__") for key in value):
                return {key: walk(item) for key, item in value.items()}
            return {"__dict__": [[walk(key), walk(item)] for key, item in value.items()]}
        if isinstance(value, tuple):
            return {"__tuple__": [walk(item) for item in value]}
        if isinstance(value, list):
            return [walk(item) for item in value]
        if value is None or isinstance(value, bool | int | float | str):
            return value
        raise TypeError(f"cannot checkpoint a {type(value).__name__}: use tensors, numbers, strings, lists, dicts")

    return walk(state), tensors


def unflatten(skeleton: Any, tensors: list[torch.Tensor]) -> Any:
    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            if "__tensor__" in value:
                return tensors[value["__tensor__"]]
            if "__dict__" in value:
                return {walk(key): walk(item) for key, item in value["__dict__"]}
            if "__tuple__" in value:
                return tuple(walk(item) for item in value["__tuple__"])
            return {key: walk(item) for key, item in value.items()}
        if isinstance(value, list):
            return [walk(item) for item in value]
        return value

    return walk(skeleton)


def layout(tensors: list[torch.Tensor]) -> list[TensorMeta]:
    """Offsets of each tensor's bytes in the data section."""
    metas, offset = [], 0
    for tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        metas.append(TensorMeta(str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), offset, nbytes))
        offset += -(-nbytes // ALIGN) * ALIGN
    return metas


def as_bytes(tensor: torch.Tensor) -> memoryview:
    """A zero-copy byte view of a contiguous CPU tensor."""
    flat = tensor.reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    view: memoryview = flat.view(torch.uint8).numpy().data
    return view.cast("B")


def copy_threads() -> int:
    """Threads for snapshot copies and checksums: one per core this process may use, 2 to 8 (one Python thread
    cannot saturate memory bandwidth; more than the cores only contend)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 2
    return max(2, min(8, cores))


def parallel(work: Callable[[T], object], items: list[T], pool: Executor, threads: int = 2) -> None:
    """Run ``work`` over ``items`` on ``threads`` threads, largest items dealt round-robin so all finish together."""
    ordered = sorted(items, key=_size, reverse=True)
    parts = [ordered[i::threads] for i in range(threads)]
    for future in [pool.submit(lambda part: [work(item) for item in part], part) for part in parts if part]:
        future.result()


def _size(item: object) -> int:
    tensor = item[0] if isinstance(item, tuple) else item
    return int(tensor.numel() * tensor.element_size()) if isinstance(tensor, torch.Tensor) else 0


def checksum(tensor: torch.Tensor) -> int:
    return int(xxhash.xxh3_64_intdigest(as_bytes(tensor)))


def dtype_of(name: str) -> torch.dtype:
    try:
        return _DTYPES[name]
    except KeyError:
        raise CorruptCheckpoint(f"unknown dtype '{name}' in shard header") from None


def encode_header(step: int, rank: int, world_size: int, skeleton: Any, metas: list[TensorMeta]) -> bytes:
    """The bytes before the data section, padded so the data starts 64-byte aligned."""
    header = json.dumps(
        {
            "step": step,
            "rank": rank,
            "world_size": world_size,
            "skeleton": skeleton,
            "tensors": [meta.as_json() for meta in metas],
        },
        separators=(",", ":"),
    ).encode()
    prefix = MAGIC + struct.pack("<Q", len(header)) + header
    return prefix + b"\0" * (-len(prefix) % ALIGN)


def decode_header(blob: Buffer) -> tuple[dict[str, Any], int]:
    """Parse a shard's header; return it and where the data section starts.

    Raises:
        CorruptCheckpoint: not a raypod shard, or a truncated or garbled header.
    """
    view = memoryview(blob)
    if bytes(view[: len(MAGIC)]) != MAGIC or len(view) < len(MAGIC) + 8:
        raise CorruptCheckpoint("not a raypod checkpoint shard (bad magic)")
    (length,) = struct.unpack("<Q", view[len(MAGIC) : len(MAGIC) + 8])
    start = len(MAGIC) + 8
    if start + length > len(view):
        raise CorruptCheckpoint("truncated shard header")
    try:
        header: dict[str, Any] = json.loads(bytes(view[start : start + length]))
    except ValueError:
        raise CorruptCheckpoint("garbled shard header") from None
    if not isinstance(header, dict) or not set(header) >= HEADER_KEYS:
        raise CorruptCheckpoint("garbled shard header (fields missing)")
    data = start + length
    return header, data + (-data % ALIGN)


def decode_shard(blob: Buffer, copy: bool = True) -> tuple[dict[str, Any], Any]:
    """Rebuild the state of a shard file's bytes, verifying every tensor's checksum.

    Raises:
        CorruptCheckpoint: a truncated shard or a tensor whose bytes do not match its checksum.
    """
    header, data = decode_header(blob)
    view = memoryview(blob)
    tensors = []
    for index, meta in enumerate(header["tensors"]):
        start, end = data + meta["offset"], data + meta["offset"] + meta["nbytes"]
        if end > len(view):
            raise CorruptCheckpoint(f"shard truncated inside tensor {index}")
        chunk = view[start:end]
        if meta["checksum"] is not None and xxhash.xxh3_64_intdigest(chunk) != meta["checksum"]:
            raise CorruptCheckpoint(f"tensor {index} does not match its checksum")
        dtype = dtype_of(meta["dtype"])
        raw = torch.frombuffer(bytearray(chunk) if copy else chunk, dtype=torch.uint8) if meta["nbytes"] else None
        tensor = raw.view(dtype).reshape(meta["shape"]) if raw is not None else torch.empty(meta["shape"], dtype=dtype)
        tensors.append(tensor)
    return header, unflatten(header["skeleton"], tensors)
