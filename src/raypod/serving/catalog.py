"""What the catalog knows about a model: where its files are, their sizes and checksums, and what it needs.

A source is a Hugging Face id (``org/name``, read through the hub when it is reachable), a local directory, or any
fsspec URL (``s3://bucket/prefix``, ``file:///path``). Reading a source needs only the header of each safetensors
file for the parameter count; checksums read every byte once, when the model is added and when it is deployed.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import struct
from collections.abc import Callable
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field, field_validator

MODEL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}(/[A-Za-z0-9][A-Za-z0-9._-]{0,63})?$")
HF_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
WEIGHT_SUFFIXES = (".safetensors",)
MODEL_FILES = (".json", ".safetensors", ".jinja", ".txt", ".model", ".tiktoken", ".py")
SECRET_OPTIONS = re.compile(r"(key|secret|token|password|credential)", re.IGNORECASE)
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
TORCH_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
RUNTIME_OVERHEAD = 1.25  # weights in memory plus activations and allocator slack, per replica
HASH_BLOCK = 8 * 2**20


class CatalogError(ValueError):
    """A source that cannot be read, or whose files are missing, incomplete or corrupt: the message says which."""


class ModelFile(BaseModel):
    path: str
    size: int
    sha256: str


class ModelSource(BaseModel):
    """What a user gives to add a model."""

    id: str = Field(description="The catalog id, e.g. 'llama-tiny' or 'org/name'.")
    source: str = Field(description="Hugging Face id, local directory, or fsspec URL (s3://bucket/prefix).")
    storage_options: dict[str, Any] = Field(
        default_factory=dict,
        description="fsspec options that are not secrets (endpoint_url, region); credentials come from the "
        "environment of the server and the nodes (AWS_ACCESS_KEY_ID, ...), never from the catalog.",
    )
    description: str = Field("", max_length=500)

    @field_validator("id")
    @classmethod
    def _valid_id(cls, value: str) -> str:
        if not MODEL_ID.match(value):
            raise ValueError("a model id is 1-64 letters, digits, '.', '_' or '-', optionally 'org/name'")
        return value

    @field_validator("storage_options")
    @classmethod
    def _no_secrets(cls, value: dict[str, Any]) -> dict[str, Any]:
        secret = [key for key in value if SECRET_OPTIONS.search(key)]
        if secret:
            raise ValueError(
                f"storage_options may not hold credentials ({', '.join(sorted(secret))}): give them to the server "
                "and the nodes through the environment (e.g. AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)"
            )
        return value


class ModelEntry(ModelSource):
    architecture: str
    model_type: str
    parameters: int
    dtype: str
    size_bytes: int
    memory_bytes: int = Field(description="What one replica needs in memory: weights plus runtime overhead.")
    max_context: int
    kv_bytes_per_token: int
    files: list[ModelFile]
    added_by: str = ""
    added_at: datetime | None = None
    warnings: list[str] = Field(
        default_factory=list, description="Said when it is added (not stored): e.g. nodes that cannot read it."
    )

    def digest(self) -> str:
        """Names this exact set of files: a node's cache of another version never passes for this one."""
        listing = "\n".join(f"{f.path}\0{f.size}\0{f.sha256}" for f in sorted(self.files, key=lambda f: f.path))
        return hashlib.sha256(listing.encode()).hexdigest()[:16]


class AdditionStatus(StrEnum):
    INSPECTING = "INSPECTING"  # the server reads and checksums the source
    ADDED = "ADDED"
    FAILED = "FAILED"


class ModelAddition(BaseModel):
    """A request to add (or replace) a catalog entry, answered at once: reading and checksumming a source takes
    minutes for a large model, so the serving applier does it and this says how far it is."""

    id: str
    status: AdditionStatus
    source: str
    requested_by: str
    requested_at: datetime
    failure: str | None = Field(None, description="Why the source could not be added (FAILED).")
    entry: ModelEntry | None = Field(None, description="The catalog entry (ADDED).")


def local_path(source: str) -> str | None:
    """The directory of a source on the server's own filesystem (a path or ``file://``), else None."""
    if source.startswith("file://"):
        return source.removeprefix("file://")
    if "://" not in source and not is_hub_id(source):
        return os.path.abspath(source)
    return None


def is_hub_id(source: str) -> bool:
    """``org/name`` is a Hugging Face id; ``/path``, ``./path`` and URLs are not."""
    return "://" not in source and not source.startswith(("/", ".")) and bool(HF_ID.match(source))


def resolve(source: str, storage_options: dict[str, Any]) -> tuple[Any, str]:
    """(filesystem, root path) of a source. Raises CatalogError."""
    import fsspec

    url = source
    if is_hub_id(source):
        url = f"hf://{source}"
    try:
        fs, root = fsspec.core.url_to_fs(url, **storage_options)
    except (ImportError, ValueError, TypeError) as exc:
        raise CatalogError(f"cannot open {source}: {exc}") from None
    fs.invalidate_cache()  # fsspec reuses filesystems and their listings: a file changed since must be seen
    return fs, str(root).rstrip("/")


def inspect(spec: ModelSource, progress: Callable[[int, int], None] | None = None) -> ModelEntry:
    """Read a source into a catalog entry, checksumming every file. Raises CatalogError."""
    fs, root = resolve(spec.source, spec.storage_options)
    listing = _listing(fs, root, spec.source)
    config = _read_json(fs, f"{root}/config.json", spec.source)
    weights = [path for path in listing if path.endswith(WEIGHT_SUFFIXES)]
    if not weights:
        raise CatalogError(f"{spec.source} has no .safetensors weights (only safetensors are loaded, never pickles)")
    parameters, dtype_counts = 0, dict[str, int]()
    for path in weights:
        for tensor in _safetensors_header(fs, f"{root}/{path}", spec.source).values():
            if isinstance(tensor, dict) and "shape" in tensor:
                count = 1
                for dim in tensor["shape"]:
                    count *= int(dim)
                parameters += count
                dtype_counts[tensor["dtype"]] = dtype_counts.get(tensor["dtype"], 0) + count
    storage_dtype = max(dtype_counts, key=lambda d: dtype_counts[d]) if dtype_counts else "F32"
    dtype = TORCH_DTYPES.get(storage_dtype, "float32")
    total = sum(listing.values())
    files = []
    done = 0
    for path, size in sorted(listing.items()):
        report = (lambda n, before=done: progress(before + n, total)) if progress else None
        files.append(ModelFile(path=path, size=size, sha256=_sha256(fs, f"{root}/{path}", spec.source, report)))
        done += size
    layers = int(config.get("num_hidden_layers") or config.get("n_layer") or 0)
    hidden = int(config.get("hidden_size") or config.get("n_embd") or 0)
    heads = int(config.get("num_attention_heads") or config.get("n_head") or 1)
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or (hidden // heads if heads else 0))
    element = 2 if dtype in ("float16", "bfloat16") else 4
    return ModelEntry(
        **spec.model_dump(),
        architecture=(config.get("architectures") or ["unknown"])[0],
        model_type=str(config.get("model_type", "unknown")),
        parameters=parameters,
        dtype=dtype,
        size_bytes=total,
        memory_bytes=int(parameters * element * RUNTIME_OVERHEAD) + 256 * 2**20,
        max_context=int(config.get("max_position_embeddings") or config.get("n_positions") or 2048),
        kv_bytes_per_token=2 * layers * kv_heads * head_dim * element,
        files=files,
    )


def verify(entry: ModelEntry, checksums: bool = True) -> None:
    """That the source still holds exactly the catalog's files. Raises CatalogError naming the first bad one."""
    fs, root = resolve(entry.source, entry.storage_options)
    listing = _listing(fs, root, entry.source)
    for file in entry.files:
        size = listing.get(file.path)
        if size is None:
            raise CatalogError(f"model {entry.id}: {file.path} is missing from {entry.source}")
        if size != file.size:
            raise CatalogError(f"model {entry.id}: {file.path} is {size} bytes, the catalog recorded {file.size}")
        if checksums and _sha256(fs, f"{root}/{file.path}", entry.source) != file.sha256:
            raise CatalogError(f"model {entry.id}: {file.path} is corrupt (its sha256 does not match the catalog)")


def _listing(fs: Any, root: str, source: str) -> dict[str, int]:
    try:
        found = fs.find(root, detail=True)
        if not found and not fs.exists(root):
            raise FileNotFoundError(root)
    except FileNotFoundError:
        raise CatalogError(f"{source} does not exist") from None
    except Exception as exc:
        raise CatalogError(f"cannot list {source}: {type(exc).__name__}: {exc}") from None
    listing = {}
    for path, info in found.items():
        relative = posixpath.relpath(str(path).rstrip("/"), root)
        if info.get("type") == "file" and relative.endswith(MODEL_FILES) and not relative.startswith("."):
            listing[relative] = int(info.get("size") or 0)
    if "config.json" not in listing:
        raise CatalogError(f"{source} has no config.json: not a Hugging Face model directory")
    return listing


def _read_json(fs: Any, path: str, source: str) -> dict[str, Any]:
    try:
        value = json.loads(fs.cat_file(path))
    except (OSError, ValueError) as exc:
        raise CatalogError(f"{source}: cannot read {posixpath.basename(path)} ({exc})") from None
    if not isinstance(value, dict):
        raise CatalogError(f"{source}: {posixpath.basename(path)} is not a JSON object")
    return value


def _safetensors_header(fs: Any, path: str, source: str) -> dict[str, Any]:
    try:
        with fs.open(path, "rb") as handle:
            (size,) = struct.unpack("<Q", handle.read(8))
            if size > 100 * 2**20:
                raise ValueError("header over 100 MiB")
            header = json.loads(handle.read(size))
    except (OSError, ValueError, struct.error) as exc:
        raise CatalogError(f"{source}: {posixpath.basename(path)} is not a readable safetensors file ({exc})") from None
    return header if isinstance(header, dict) else {}


def _sha256(fs: Any, path: str, source: str, progress: Callable[[int], object] | None = None) -> str:
    digest = hashlib.sha256()
    done = 0
    try:
        with fs.open(path, "rb", block_size=HASH_BLOCK) as handle:
            while block := handle.read(HASH_BLOCK):
                digest.update(block)
                done += len(block)
                if progress:
                    progress(done)
    except OSError as exc:
        raise CatalogError(f"{source}: cannot read {path} ({exc})") from None
    return digest.hexdigest()


def copy_to_store(entry: ModelEntry, url: str, storage_options: dict[str, Any]) -> ModelEntry:
    """Copy the catalogued files of ``entry`` under ``url`` (``<url>/<id>/<digest>/``), skipping files already
    there at their size (a copy cut short goes on); the entry as read from there. Nodes check every checksum when
    they stage it. Raises CatalogError."""
    source_fs, source_root = resolve(entry.source, entry.storage_options)
    target = f"{url.rstrip('/')}/{entry.id}/{entry.digest()}"
    target_fs, target_root = resolve(target, storage_options)
    try:
        present = _listing(target_fs, target_root, target)
    except CatalogError:
        present = {}
    try:
        for file in entry.files:
            if present.get(file.path) == file.size:
                continue
            with source_fs.open(f"{source_root}/{file.path}", "rb") as reader:
                target_fs.pipe_file(f"{target_root}/{file.path}", reader.read())
    except OSError as exc:
        raise CatalogError(f"cannot copy {entry.id} to {target}: {exc}") from None
    return entry.model_copy(update={"source": target, "storage_options": dict(storage_options)})
