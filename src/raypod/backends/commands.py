"""Bounded commands on a node's host: user health checks run through this, whatever backend runs the node."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

MAX_OUTPUT_BYTES = 4096


@dataclass(frozen=True)
class CommandResult:
    exit_code: int | None  # None: killed at its timeout
    output: str
    duration_s: float


def run_command(
    argv: list[str],
    *,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    max_output: int = MAX_OUTPUT_BYTES,
    pass_fds: tuple[int, ...] = (),
) -> CommandResult:
    """Run a command in its own process group; kill the group at the timeout. Output past ``max_output`` is read
    and dropped, so a chatty command neither blocks on a full pipe nor fills memory."""
    started = time.monotonic()
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=dict(env) if env is not None else None,
        cwd=cwd,
        start_new_session=True,
        close_fds=True,
        pass_fds=pass_fds,
    )
    kept = bytearray()

    def read() -> None:
        assert process.stdout is not None
        while chunk := process.stdout.read(65536):
            if len(kept) < max_output:
                kept.extend(chunk[: max_output - len(kept)])

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        exit_code: int | None = process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        exit_code = None
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)  # the command's children too, whether or not it exited
    process.wait()
    reader.join(timeout=2)
    if process.stdout is not None:
        process.stdout.close()
    text = kept.decode(errors="replace")
    if len(kept) >= max_output:
        text += "\n[output truncated]"
    return CommandResult(exit_code, text, time.monotonic() - started)
