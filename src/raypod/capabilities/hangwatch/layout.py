"""The files a node's hangwatch directory holds, shared by the ranks (writers of ``ranks/``), the agent, and the
backend that starts the agent. JSON, written whole and renamed into place, so a reader never sees half a file.

::

    $RAYPOD_HANGWATCH_DIR/
      config.json          the cluster's HangwatchSpec (the backend writes it before the agent starts)
      ranks/<pid>.json     one per Ray Train worker process on this node, rewritten at each report and pause
      state.json           the agent's timers: log offsets, rule clocks, hang counts (it survives a restart)
      status.json          what the agent sees now, per run and rank, for the control plane and the console
      detections/<id>.json one per detection, with its diagnostics
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

DIR_VARIABLE = "RAYPOD_HANGWATCH_DIR"
CALLBACK = "raypod.capabilities.hangwatch.train_callback.HangwatchCallback"
CALLBACKS_VARIABLE = "RAY_TRAIN_CALLBACKS"


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(descriptor, "w") as handle:
            json.dump(data, handle, separators=(",", ":"))
        os.replace(temporary, path)
    except BaseException:
        with_suppressed_unlink(temporary)
        raise


def read_json(path: Path) -> dict[str, Any] | None:
    """The file's object; None when it is missing, unreadable or not a JSON object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def with_suppressed_unlink(path: str | Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def ranks_dir(root: Path) -> Path:
    return root / "ranks"


def detections_dir(root: Path) -> Path:
    return root / "detections"
