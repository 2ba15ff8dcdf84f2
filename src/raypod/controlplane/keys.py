"""Keys the server makes once and keeps 0600 in its home, so that what they sign survives a restart."""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from pathlib import Path


def kept_key(path: Path) -> bytes:
    """The key at ``path``, made there first if missing. Written whole to a temporary file and linked into place,
    so that no reader ever sees it half written and the first maker wins."""
    with contextlib.suppress(FileNotFoundError):
        return path.read_bytes()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # 0600
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(secrets.token_bytes(32))
        with contextlib.suppress(FileExistsError):
            os.link(temporary, path)
    finally:
        os.unlink(temporary)
    return path.read_bytes()
