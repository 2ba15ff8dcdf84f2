"""Files in a directory that someone else may change (a node's hangwatch directory, a workspace's files), read
and written by raypod's server without trusting them.

A job on a node can replace any file or folder it can write with a symbolic link (to another cluster's files, to
raypod's own, to the host's), or with a huge or malformed file. Through these functions no link is followed
anywhere on the way (the walk starts at ``/``: give paths without links, the host's own resolved), only regular
files are read, and only up to a size; writes create new files and rename them into place.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
from pathlib import Path
from typing import Any


def read_json(directory: Path, relative: str, max_bytes: int) -> dict[str, Any] | None:
    """The JSON object at ``directory/relative``; None when it is missing, not a regular file, a link, larger than
    ``max_bytes``, or not a JSON object."""
    raw = read_bytes(directory, relative, max_bytes)
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def read_bytes(directory: Path, relative: str, max_bytes: int) -> bytes | None:
    *parents, name = relative.split("/")
    try:
        folder = _open_dir(directory, parents, create=False)
    except OSError:
        return None
    try:
        descriptor = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
    except OSError:
        return None
    finally:
        os.close(folder)
    with os.fdopen(descriptor, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            return None
        raw = handle.read(max_bytes + 1)
    return raw if len(raw) <= max_bytes else None


def write_json(directory: Path, relative: str, data: dict[str, Any]) -> None:
    write_bytes(directory, relative, json.dumps(data, separators=(",", ":")).encode())


def write_bytes(directory: Path, relative: str, data: bytes, mode: int = 0o600) -> None:
    """Write ``data`` whole to ``directory/relative`` (missing folders made 0700), renamed into place.

    Raises:
        OSError: a link or a non-directory stands in the way."""
    *parents, name = relative.split("/")
    folder = _open_dir(directory, parents, create=True)
    try:
        temporary = f".{name}.{secrets.token_hex(6)}"
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=folder)
        try:
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(data)
            os.replace(temporary, name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=folder)
            raise
    finally:
        os.close(folder)


def list_names(directory: Path, relative: str, suffix: str, limit: int) -> list[str]:
    """The first ``limit`` names (sorted) in ``directory/relative`` that end with ``suffix``; [] when it is
    missing or a link."""
    try:
        folder = _open_dir(directory, relative.split("/"), create=False)
    except OSError:
        return []
    try:
        return sorted(name for name in os.listdir(folder) if name.endswith(suffix))[:limit]
    finally:
        os.close(folder)


def _open_dir(directory: Path, parents: list[str], *, create: bool) -> int:
    """A descriptor of ``directory/parents...``, walked from ``/`` one name at a time without following a link;
    with ``create``, missing folders below ``directory`` are made."""
    if not directory.is_absolute():
        raise OSError(f"not an absolute path: {directory}")
    own = len(directory.parts) - 1
    names = [*directory.parts[1:], *(p for p in parents if p)]
    if any(name in (".", "..") for name in names):
        raise OSError("a relative name in the path")
    folder = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for index, name in enumerate(names):
            if create and index >= own:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o700, dir_fd=folder)
            inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=folder)
            os.close(folder)
            folder = inner
    except BaseException:
        os.close(folder)
        raise
    return folder
