"""The local backend's GCS client keeps its connection through a GCS that stops answering for a while.

A real stopped GCS is ``tests/e2e/test_resilience.py``'s (it must be Ready again soon after it answers); here the
client's error path alone, with Ray's own RpcError raised by a stand-in client (making a real client of a GCS
that does not answer takes over 30 s, which is the point of keeping it)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from ray.exceptions import RpcError

from raypod.backends.local.gcs import DEADLINE_EXCEEDED, Gcs


class StandIn:
    def __init__(self, error: Exception) -> None:
        self.error = error
        self.timeouts: list[float | None] = []

    def get_all_node_info(self, timeout: float) -> dict[object, object]:
        raise self.error

    def drain_node(self, *args: object, timeout: float | None = None) -> tuple[bool, str]:
        self.timeouts.append(timeout)
        raise self.error

    def internal_kv_put(self, *args: object, timeout: float | None = None) -> int:
        self.timeouts.append(timeout)
        raise self.error


@pytest.fixture
def process_token() -> Iterator[str]:
    """The Ray token this test process uses already (tests/conftest.py), for the client to present: it sets the
    process's token while it calls, and a Ray driver that another test started in this process must keep
    authenticating meanwhile. The variables are put back afterwards."""
    saved = {name: os.environ.get(name) for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    token = saved["RAY_AUTH_TOKEN"] or Path(os.environ["RAY_AUTH_TOKEN_PATH"]).read_text().strip()
    yield token
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture
def listening_port() -> Iterator[int]:
    """A port that accepts connections and never answers: a GCS that is SIGSTOPped looks like this."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_gcs_that_does_not_answer_in_time_keeps_its_client(listening_port: int, process_token: str) -> None:
    gcs = Gcs(lambda cluster: process_token)
    silent = StandIn(RpcError("RPC error: Deadline Exceeded", rpc_code=DEADLINE_EXCEEDED))
    gcs._clients["c"] = (listening_port, silent)
    table = gcs.node_table("c", listening_port)
    assert table.error is not None and "Deadline Exceeded" in table.error
    assert gcs._clients["c"] == (listening_port, silent), "dropped: the next pass would wait for a new client"


def test_a_client_that_fails_otherwise_is_made_anew(listening_port: int, process_token: str) -> None:
    gcs = Gcs(lambda cluster: process_token)
    gcs._clients["c"] = (listening_port, StandIn(RpcError("cluster ID mismatch", rpc_code=9)))
    assert gcs.node_table("c", listening_port).error is not None
    assert "c" not in gcs._clients


def test_every_call_the_loop_makes_to_a_gcs_is_bounded(listening_port: int, process_token: str) -> None:
    """Ray's client waits forever by default: a drain or a key write to a stopped GCS would hold the loop."""
    from raypod import errors
    from raypod.backends.local.gcs import GCS_TIMEOUT_S

    gcs = Gcs(lambda cluster: process_token)
    silent = StandIn(RpcError("RPC error: Deadline Exceeded", rpc_code=DEADLINE_EXCEEDED))
    gcs._clients["c"] = (listening_port, silent)
    with pytest.raises(errors.TransientError, match="cannot drain node cpu-0"):
        gcs.drain("c", listening_port, "cpu-0", "ab" * 28, deadline=0.0, reason="scaled down")
    with pytest.raises(errors.TransientError, match="key-value store"):
        gcs.put_kv("c", listening_port, b"ns", b"key", b"value")
    assert silent.timeouts == [GCS_TIMEOUT_S, GCS_TIMEOUT_S]
