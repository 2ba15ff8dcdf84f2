"""Inside a Ray Train worker process: the rank's progress, pauses and settings, in the file its node's agent
reads. Runs in training processes, so it imports the standard library and raypod's light modules only."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path
from typing import Any

from raypod.capabilities.hangwatch import layout


class RankRecorder:
    """One per worker process. Every change rewrites the rank's file (a few hundred bytes, renamed into place):
    at most one per report, and the agent never has to ask the process anything."""

    def __init__(self, root: Path, identity: dict[str, Any], job_overrides: dict[str, Any] | None) -> None:
        now = time.time()
        self.path = layout.ranks_dir(root) / f"{os.getpid()}.json"
        self._lock = threading.Lock()
        self._pauses: list[str] = []
        self.record: dict[str, Any] = {
            **identity,
            "pid": os.getpid(),
            "started": now,
            "clock": now,  # the stall timer counts from here: the last report, moved on by each pause's length
            "reports": 0,
            "last_report": None,
            "slowest_step_s": 0.0,
            "paused": None,
            "paused_since": None,
            "job_overrides": job_overrides,
            "run_overrides": None,
            "finished": False,
            "log": _stdout_path(),
        }
        self._write()

    def reported(self) -> None:
        with self._lock:
            now = time.time()
            if self.record["reports"]:
                self.record["slowest_step_s"] = max(self.record["slowest_step_s"], now - self.record["clock"])
            self.record.update(reports=self.record["reports"] + 1, last_report=now, clock=now)
            self._write()

    def pause(self, reason: str) -> None:
        with self._lock:
            self._pauses.append(reason)
            if len(self._pauses) == 1:
                self.record.update(paused=reason, paused_since=time.time())
                self._write()

    def resume(self) -> None:
        with self._lock:
            if not self._pauses:
                return
            self._pauses.pop()
            if not self._pauses:
                now = time.time()
                since = self.record["paused_since"] or now
                self.record.update(
                    clock=min(now, self.record["clock"] + (now - since)), paused=None, paused_since=None, resumed=now
                )
                self._write()

    def configure(self, overrides: dict[str, Any]) -> None:
        with self._lock:
            self.record["run_overrides"] = overrides
            self._write()

    def finish(self) -> None:
        with self._lock:
            self.record["finished"] = True
            self._write()

    def _write(self) -> None:
        with contextlib.suppress(OSError):  # progress reporting must never break training
            layout.write_json(self.path, self.record)


_current: RankRecorder | None = None


def current() -> RankRecorder | None:
    return _current


def start(root: Path, identity: dict[str, Any], job_overrides: dict[str, Any] | None) -> RankRecorder:
    global _current
    _current = RankRecorder(root, identity, job_overrides)
    return _current


def _stdout_path() -> str | None:
    """The file this process's stdout goes to: Ray points it at the worker's log, which the agent tails."""
    try:
        target = os.readlink("/proc/self/fd/1")
    except OSError:
        return None
    return target if target.startswith("/") and os.path.isfile(target) else None
