"""Working-dir packages: a folder uploaded from a browser becomes the zip Ray's ``runtime_env`` expects."""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import PurePosixPath

from raypod import errors

MAX_WORKING_DIR_BYTES = 100 * 2**20


def build_package(files: list[tuple[str, bytes]]) -> bytes:
    """A deterministic zip of ``files``; a folder name every path shares is dropped, as Ray's working_dir
    is the folder's contents.

    Raises:
        InvalidSpec: no files, an absolute or escaping path, or too many bytes.
    """
    if not files:
        raise errors.InvalidSpec("working dir: no files were uploaded")
    if sum(len(data) for _, data in files) > MAX_WORKING_DIR_BYTES:
        raise errors.InvalidSpec(f"working dir: more than {MAX_WORKING_DIR_BYTES // 2**20} MiB")
    paths = []
    for name, _ in files:
        path = PurePosixPath(name.replace("\\", "/"))
        if path.is_absolute() or not path.parts or any(part in ("", ".", "..") for part in path.parts):
            raise errors.InvalidSpec(f"working dir: unsafe file path '{name[:200]}'")
        paths.append(path)
    tops = {path.parts[0] for path in paths}
    if len(tops) == 1 and all(len(path.parts) > 1 for path in paths):
        paths = [PurePosixPath(*path.parts[1:]) for path in paths]
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path, (_, data) in sorted(zip(paths, files, strict=True), key=lambda item: str(item[0])):
            archive.writestr(zipfile.ZipInfo(str(path), date_time=(1980, 1, 1, 0, 0, 0)), data, zipfile.ZIP_DEFLATED)
    return buffer.getvalue()


def package_name(package: bytes) -> str:
    """Ray's content-addressed name of a package (``_ray_pkg_<sha1>.zip``), as its own upload names it."""
    return f"_ray_pkg_{hashlib.sha1(package).hexdigest()}.zip"
