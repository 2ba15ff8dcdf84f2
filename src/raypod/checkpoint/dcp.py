"""PyTorch Distributed Checkpoint storage with tiers: a ``StorageWriter`` that writes to local disk (what DCP's
``FileSystemWriter`` does) and then uploads the checkpoint to a durable fsspec URL in the background, and a
``StorageReader`` that loads from local disk when it holds a verified complete copy, else from durable storage.

    writer = TieredWriter(f"/local/ckpt/step-{step}", durable_url=f"s3://bucket/ckpt/step-{step}")
    dcp.async_save(state, storage_writer=writer)      # or dcp.save
    ...
    dcp.load(state, storage_reader=TieredReader(f"/local/ckpt/step-{step}", f"s3://bucket/ckpt/step-{step}"))

In each tier a checkpoint is complete only once ``.raypod-complete`` (file names, sizes and xxh3 checksums) is
written, after every other file. The local directory must be visible to every rank (one node or a shared file
system), as with ``FileSystemWriter``.

DCP's ``.metadata`` is a pickle, and loading a pickle runs code. A copy from durable storage (a bucket others may
write) is therefore loaded only when its marker carries a valid HMAC made with the writer's key: ``key=``, else
``DCP_CHECKPOINT_KEY`` from the environment, else one derived from the cluster's own Ray token (``RAY_AUTH_TOKEN``,
which raypod gives every node of a cluster and no other cluster): set ``DCP_CHECKPOINT_KEY`` in the cluster's env
to resume a run on another cluster. File names in a marker are plain names; one that would leave the checkpoint's
directory is refused.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

import fsspec
import xxhash
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.storage import WriteResult

from raypod.checkpoint.format import CorruptCheckpoint

log = logging.getLogger(__name__)
MARKER = ".raypod-complete"


def _file_checksum(path: Path) -> int:
    digest = xxhash.xxh3_64()
    with open(path, "rb") as source:
        while chunk := source.read(16 * 2**20):
            digest.update(chunk)
    return int(digest.intdigest())


def _inventory(folder: Path) -> dict[str, dict[str, int]]:
    return {
        entry.name: {"bytes": entry.stat().st_size, "xxh3": _file_checksum(entry)}
        for entry in sorted(folder.iterdir())
        if entry.is_file() and entry.name != MARKER and not entry.name.endswith(".tmp")
    }


KEY_VARIABLE = "DCP_CHECKPOINT_KEY"


def signing_key(key: bytes | str | None = None) -> bytes | None:
    """The key that signs a marker: given, from the environment, or derived from the cluster's Ray token."""
    if key is None:
        key = os.environ.get(KEY_VARIABLE) or None
    if key is None and os.environ.get("RAY_AUTH_TOKEN"):
        return hmac.new(os.environ["RAY_AUTH_TOKEN"].encode(), b"raypod-dcp-checkpoint", hashlib.sha256).digest()
    return key.encode() if isinstance(key, str) else key


def _signature(files: dict[str, Any], key: bytes) -> str:
    return hmac.new(key, json.dumps(files, sort_keys=True).encode(), hashlib.sha256).hexdigest()


def _marker(files: dict[str, Any], key: bytes | None) -> str:
    return json.dumps({"files": files, **({"hmac": _signature(files, key)} if key else {})})


def _checked_names(marker: bytes, source: str, key: bytes | None, *, signed: bool) -> dict[str, Any]:
    """The marker's files, after refusing names that leave the directory and, with ``signed``, a marker whose
    HMAC does not match ``key``.

    Raises:
        CorruptCheckpoint."""
    try:
        data = json.loads(marker)
        files = data["files"]
    except (ValueError, KeyError, TypeError):
        raise CorruptCheckpoint(f"{source}: unreadable marker") from None
    if not isinstance(files, dict):
        raise CorruptCheckpoint(f"{source}: unreadable marker")
    for name in files:
        if not isinstance(name, str) or name in ("", ".", "..", MARKER) or "/" in name or "\\" in name or "\0" in name:
            raise CorruptCheckpoint(f"{source}: the marker names a file outside the checkpoint ({str(name)[:80]!r})")
    if signed:
        if key is None:
            raise CorruptCheckpoint(
                f"{source}: a durable copy is loaded only when signed (its .metadata is a pickle): set "
                f"{KEY_VARIABLE} (or run on the raypod cluster that wrote it)"
            )
        given = data.get("hmac")
        if not isinstance(given, str) or not hmac.compare_digest(given, _signature(files, key)):
            raise CorruptCheckpoint(f"{source}: the marker is not signed with this cluster's key; refusing to load it")
    return files


def _verify(folder: Path) -> None:
    """Raises CorruptCheckpoint: no marker (incomplete) or a file that does not match it."""
    try:
        expected = _checked_names((folder / MARKER).read_bytes(), str(folder), None, signed=False)
    except OSError:
        raise CorruptCheckpoint(f"{folder}: no complete checkpoint (marker missing)") from None
    for name, info in expected.items():
        path = folder / name
        if not path.exists() or path.stat().st_size != info["bytes"] or _file_checksum(path) != info["xxh3"]:
            raise CorruptCheckpoint(f"{folder}: {name} is missing or does not match its checksum")


class TieredWriter(FileSystemWriter):
    """DCP ``FileSystemWriter`` to a local directory, plus a background upload to ``durable_url``."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        durable_url: str | None = None,
        storage_options: dict[str, Any] | None = None,
        key: bytes | str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(path, **kwargs)
        self.key = signing_key(key)
        self.durable_url = durable_url
        self.storage_options = storage_options or {}
        self.upload: threading.Thread | None = None
        self.upload_error: str | None = None

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        super().finish(metadata, results)
        folder = Path(self.path)
        marker = _marker(_inventory(folder), self.key)
        partial = folder / f"{MARKER}.tmp"
        partial.write_text(marker)
        with open(partial, "rb+") as handle:
            os.fsync(handle.fileno())
        partial.replace(folder / MARKER)
        if self.durable_url:
            self.upload = threading.Thread(target=self._upload, args=(folder, marker), daemon=True)
            self.upload.start()

    def _upload(self, folder: Path, marker: str) -> None:
        try:
            fs, root = fsspec.core.url_to_fs(self.durable_url, **self.storage_options)
            fs.makedirs(root, exist_ok=True)
            for name in json.loads(marker)["files"]:
                fs.put_file(str(folder / name), f"{root}/{name}")
            fs.pipe_file(f"{root}/{MARKER}", marker.encode())
        except Exception as exc:
            self.upload_error = f"{type(exc).__name__}: {exc}"
            log.warning("DCP checkpoint %s: upload to %s failed (%s)", folder, self.durable_url, self.upload_error)

    def wait_upload(self, timeout: float | None = None) -> bool:
        """Whether the durable copy is complete (False: still uploading, or failed: see ``upload_error``)."""
        if self.upload is not None:
            self.upload.join(timeout)
            if self.upload.is_alive():
                return False
        return self.durable_url is None or self.upload_error is None


class TieredReader(FileSystemReader):
    """DCP ``FileSystemReader`` over the fastest verified copy: the local directory, else a download of the
    durable one into ``cache_dir``. ``tier`` says which was used.

    Raises:
        CorruptCheckpoint: no tier holds a complete, verified copy.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        durable_url: str | None = None,
        storage_options: dict[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        key: bytes | str | None = None,
    ) -> None:
        problems = []
        self.key = signing_key(key)
        local = Path(path)
        try:
            _verify(local)
            chosen, self.tier = local, "disk"
        except CorruptCheckpoint as exc:
            problems.append(str(exc))
            if not durable_url:
                raise
            chosen = self._download(durable_url, storage_options or {}, cache_dir, problems, self.key)
            self.tier = "durable"
        if problems:
            log.warning("DCP checkpoint: %s; using the %s tier", "; ".join(problems), self.tier)
        super().__init__(chosen)

    @staticmethod
    def _download(url: str, options: dict[str, Any], cache_dir: Any, problems: list[str], key: bytes | None) -> Path:
        fs, root = fsspec.core.url_to_fs(url, **options)
        target = Path(cache_dir) if cache_dir else Path(tempfile.mkdtemp(prefix="raypod-dcp-"))
        target.mkdir(parents=True, exist_ok=True)
        try:
            marker = fs.cat_file(f"{root}/{MARKER}")
        except FileNotFoundError:
            raise CorruptCheckpoint(f"{url}: no complete checkpoint ({'; '.join(problems)})") from None
        for name in _checked_names(marker, url, key, signed=True):
            fs.get_file(f"{root}/{name}", str(target / name))
        (target / MARKER).write_bytes(marker)
        _verify(target)
        return target
