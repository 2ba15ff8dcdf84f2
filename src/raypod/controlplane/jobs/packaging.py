"""Working-dir packages: a folder uploaded from a browser becomes the zip Ray's ``runtime_env`` expects."""

from __future__ import annotations

import hashlib
import io
import shutil
import zipfile
from collections.abc import Sequence
from pathlib import PurePosixPath
from typing import BinaryIO

from raypod import errors

MAX_WORKING_DIR_BYTES = 100 * 2**20
CHUNK_BYTES = 2**20


Source = bytes | BinaryIO


def write_package(files: Sequence[tuple[str, Source]], out: BinaryIO, limit: int = MAX_WORKING_DIR_BYTES) -> str:
    """Write a deterministic zip of ``files`` to ``out`` and return its Ray package name; a folder name every
    path shares is dropped, as Ray's working_dir is the folder's contents. File objects are read in chunks,
    never whole.

    Raises:
        InvalidSpec: no files, an absolute or escaping path, or more than ``limit`` bytes.
    """
    if not files:
        raise errors.InvalidSpec("working dir: no files were uploaded")
    if sum(_size(data) for _, data in files) > limit:
        raise errors.InvalidSpec(f"working dir: more than {limit // 2**20} MiB")
    paths = []
    for name, _ in files:
        path = PurePosixPath(name.replace("\\", "/"))
        if path.is_absolute() or not path.parts or any(part in ("", ".", "..") for part in path.parts):
            raise errors.InvalidSpec(f"working dir: unsafe file path '{name[:200]}'")
        paths.append(path)
    tops = {path.parts[0] for path in paths}
    if len(tops) == 1 and all(len(path.parts) > 1 for path in paths):
        paths = [PurePosixPath(*path.parts[1:]) for path in paths]
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for path, (_, data) in sorted(zip(paths, files, strict=True), key=lambda item: str(item[0])):
            info = zipfile.ZipInfo(str(path), date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            with archive.open(info, "w") as member:
                if isinstance(data, bytes):
                    member.write(data)
                else:
                    data.seek(0)
                    shutil.copyfileobj(data, member, CHUNK_BYTES)
    out.seek(0)
    digest = hashlib.sha1()
    while chunk := out.read(CHUNK_BYTES):
        digest.update(chunk)
    out.seek(0)
    return f"_ray_pkg_{digest.hexdigest()}.zip"


def build_package(files: Sequence[tuple[str, Source]]) -> bytes:
    """The package of ``files`` in memory (small folders, tests); see ``write_package``."""
    buffer = io.BytesIO()
    write_package(files, buffer)
    return buffer.getvalue()


def package_name(package: bytes) -> str:
    """Ray's content-addressed name of a package (``_ray_pkg_<sha1>.zip``), as its own upload names it."""
    return f"_ray_pkg_{hashlib.sha1(package).hexdigest()}.zip"


def _size(data: Source) -> int:
    if isinstance(data, bytes):
        return len(data)
    data.seek(0, io.SEEK_END)
    size = data.tell()
    data.seek(0)
    return size
