"""Why a run is stuck: every rank's Python stacks (``py-spy dump``, which needs ptrace) and where they wait."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

DUMP_TIMEOUT_S = 8.0
MAX_STACK_CHARS = 24 * 1024
_FRAME = re.compile(r"^\s{4}(\S+) \((.*)\)\s*$")
_THREAD = re.compile(r'^Thread (0x[0-9A-Fa-f]+|\d+) \((\w+)\)(?:: "(.*)")?')
TRAINING_FRAMES = ("train_func", "train_fn", "train_loop_per_worker", "_run_train_fn")


@dataclass(frozen=True)
class Stack:
    pid: int
    text: str | None  # py-spy's dump
    error: str | None  # why there is none: py-spy missing, ptrace denied, the process gone, a timeout
    waiting_in: str | None  # the innermost frame of the training thread


def find_py_spy() -> str | None:
    """py-spy on PATH, or beside this interpreter: a virtual environment's scripts are not on PATH unless activated."""
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None


def dump_stacks(pids: list[int], timeout_s: float = DUMP_TIMEOUT_S) -> dict[int, Stack]:
    """Stacks of every process at once: the time taken is one dump's, not one per rank."""
    if not pids:
        return {}
    py_spy = find_py_spy()
    if py_spy is None:
        return {
            pid: Stack(pid, None, "py-spy is not installed on this node (pip install py-spy)", None) for pid in pids
        }
    with ThreadPoolExecutor(max_workers=min(8, len(pids))) as pool:
        return dict(zip(pids, pool.map(lambda pid: _dump(py_spy, pid, timeout_s), pids), strict=True))


def _dump(py_spy: str, pid: int, timeout_s: float) -> Stack:
    try:
        done = subprocess.run(
            [py_spy, "dump", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return Stack(pid, None, f"py-spy did not finish within {timeout_s:g} s", None)
    except OSError as exc:
        return Stack(pid, None, f"cannot run py-spy: {exc}", None)
    if done.returncode != 0:
        error = (done.stderr or done.stdout).strip().splitlines()
        message = error[-1] if error else f"exit status {done.returncode}"
        if "Permission" in (done.stderr or "") or "ptrace" in (done.stderr or "").lower():
            message = f"ptrace is not permitted here ({message})"
        return Stack(pid, None, message[:500], None)
    return Stack(pid, done.stdout[:MAX_STACK_CHARS], None, waiting_in(done.stdout))


def waiting_in(dump: str) -> str | None:
    """The innermost frame of the thread that runs the training function (else of the first thread)."""
    threads: list[list[str]] = []
    for line in dump.splitlines():
        if _THREAD.match(line):
            threads.append([])
        elif threads:
            frame = _FRAME.match(line)
            if frame:
                threads[-1].append(f"{frame.group(1)} ({frame.group(2)})")
    for frames in threads:
        if any(frame.split(" ", 1)[0] in TRAINING_FRAMES for frame in frames):
            return frames[0]
    return threads[0][0] if threads and threads[0] else None


def common_wait(waits: list[str | None]) -> str | None:
    """The function every rank waits in, when they all wait in the same one."""
    names = {w.split(" ", 1)[0] for w in waits if w}
    return names.pop() if len(names) == 1 and all(waits) else None
