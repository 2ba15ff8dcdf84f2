"""Helpers the benchmark scripts share (run as ``python benchmarks/<name>.py``, so this imports as ``_common``)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from raypod.testing import free_port


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


@dataclass
class Server:
    home: Path
    port: int
    env: dict[str, str]
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def cli(self, *args: str) -> str:
        """Run a raypod command as a user of this server would; return its stdout."""
        raypod = str(Path(sys.executable).parent / "raypod")
        return subprocess.run([raypod, *args], env=self.env, check=True, capture_output=True, text=True).stdout


@contextlib.contextmanager
def raypod_server(prefix: str) -> Iterator[Server]:
    """A raypod server process in a fresh RAYPOD_HOME, stopped and removed afterwards (delete clusters first)."""
    home = Path(tempfile.mkdtemp(prefix=prefix))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAYPOD_", "RAY_"))}
    env.update({"RAYPOD_HOME": str(home), "RAYPOD_SERVER": f"https://127.0.0.1:{port}"})
    raypod = str(Path(sys.executable).parent / "raypod")
    with open(home / "server.log", "wb") as log:
        process = subprocess.Popen(
            [raypod, "server", "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        for _ in range(200):
            if (home / "credentials").exists():
                break
            time.sleep(0.1)
        time.sleep(1)
        yield Server(home, port, env, process)
    finally:
        process.terminate()
        process.wait(timeout=60)
        shutil.rmtree(home, ignore_errors=True)
