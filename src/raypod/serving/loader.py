"""Stage a catalog model's files onto this node before an engine starts: in parallel, resumable, checksummed, into a
node-local cache that later deployments of the same files reuse.

The cache directory is named by the model id and the digest of its file list. Replicas that start together on one
node stage once: the first holds a file lock, the others wait for it and find the files complete. An interrupted
download resumes from its ``.part`` file; a file whose checksum does not match is deleted and the staging fails
naming it, so a corrupt weight never reaches an engine.

``raypod.serving.vllm.StagingCallback`` does the same for a Ray Serve LLM (vLLM) deployment.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from raypod.serving import catalog

CACHE_VARIABLE = "RAYPOD_MODEL_CACHE"
COMPLETE_MARKER = ".raypod-complete"
BLOCK = 8 * 2**20
Progress = Callable[[int, int], None]


def cache_root() -> Path:
    """Node-local: a sandboxed node's temporary directory is its own."""
    return Path(os.environ.get(CACHE_VARIABLE) or Path(tempfile.gettempdir()) / "raypod-models")


def staged_dir(entry: catalog.ModelEntry, root: Path | None = None) -> Path:
    return (root or cache_root()) / entry.id.replace("/", "--") / entry.digest()


def stage(
    entry: catalog.ModelEntry, root: Path | None = None, progress: Progress | None = None, workers: int = 4
) -> Path:
    """The local directory holding exactly the entry's files. Raises catalog.CatalogError."""
    target = staged_dir(entry, root)
    if (target / COMPLETE_MARKER).exists():
        return target
    target.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / COMPLETE_MARKER).exists():
            return target
        fs, source_root = catalog.resolve(entry.source, entry.storage_options)
        total = sum(f.size for f in entry.files)
        done = [0]
        guard = threading.Lock()

        def advance(count: int) -> None:
            with guard:
                done[0] += count
                if progress:
                    progress(done[0], total)

        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            list(pool.map(lambda f: _fetch(fs, source_root, entry, f, target, advance), entry.files))
        (target / COMPLETE_MARKER).write_text(entry.digest())
    return target


def _fetch(
    fs: Any,
    source_root: str,
    entry: catalog.ModelEntry,
    file: catalog.ModelFile,
    target: Path,
    advance: Callable[[int], None],
) -> None:
    final = target / file.path
    if final.exists() and final.stat().st_size == file.size:
        advance(file.size)
        return
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = final.with_name(final.name + ".part")
    digest = hashlib.sha256()
    offset = partial.stat().st_size if partial.exists() else 0
    if offset > file.size:
        partial.unlink()
        offset = 0
    if offset:
        with open(partial, "rb") as existing:
            while block := existing.read(BLOCK):
                digest.update(block)
        advance(offset)
    try:
        with fs.open(f"{source_root}/{file.path}", "rb", block_size=BLOCK) as source, open(partial, "ab") as out:
            source.seek(offset)
            while block := source.read(BLOCK):
                out.write(block)
                digest.update(block)
                advance(len(block))
            out.flush()
            os.fsync(out.fileno())
    except OSError as exc:
        raise catalog.CatalogError(f"model {entry.id}: cannot fetch {file.path} ({exc}); staging resumes") from None
    if partial.stat().st_size != file.size or digest.hexdigest() != file.sha256:
        partial.unlink(missing_ok=True)
        raise catalog.CatalogError(f"model {entry.id}: {file.path} is corrupt (its sha256 does not match the catalog)")
    partial.rename(final)
