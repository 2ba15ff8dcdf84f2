"""Start and stop the raypod server as a background process for ``raypod up`` / ``raypod down``."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from raypod import errors
from raypod.client import Client


def pid_file(home: Path) -> Path:
    return home / "server.pid"


def is_healthy(server: str, verify: str | bool = True) -> bool:
    with Client(server, timeout=1.0, verify=verify) as probe:
        return probe.is_healthy()


def start(home: Path, host: str, port: int, timeout: float = 30.0) -> Path:
    """Start ``raypod server`` detached (it outlives this command) and wait until it answers.

    Raises:
        TransientError: it did not answer in time; the message points at its log.
    """
    home.mkdir(parents=True, exist_ok=True)
    log_path = home / "server.log"
    env = {**os.environ, "RAYPOD_HOME": str(home)}
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "raypod", "server", "--host", host, "--port", str(port)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    pid_file(home).write_text(str(process.pid))
    url = f"https://{host}:{port}"
    ca_file = home / "tls" / "ca.crt"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ca_file.exists() and is_healthy(url, str(ca_file)):
            return log_path
        if process.poll() is not None:
            break
        time.sleep(0.2)
    raise errors.TransientError(f"the raypod server did not start; see {log_path}")


def stop(home: Path, timeout: float = 30.0) -> bool:
    """Stop the background server; its clusters keep running unless deleted first. Returns whether one ran."""
    path = pid_file(home)
    try:
        pid = int(path.read_text())
    except (FileNotFoundError, ValueError):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            os.kill(pid, 0)
            time.sleep(0.2)
        os.kill(pid, signal.SIGKILL)
    path.unlink(missing_ok=True)
    return True
