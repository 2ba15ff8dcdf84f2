"""Probes against real things: an HTTP server that answers, fails or hangs; the disk; commands that fail, hang,
or print megabytes."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from raypod.backends.commands import run_command
from raypod.capabilities.resilience import signals
from raypod.capabilities.resilience.model import Level


class _Agent(http.server.BaseHTTPRequestHandler):
    mode = "ok"

    def do_GET(self) -> None:
        if _Agent.mode == "hang":
            time.sleep(3)
        status = 200 if _Agent.mode == "ok" else 503
        body = b"success" if status == 200 else b"Local Raylet failed"
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def agent() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Agent)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    _Agent.mode = "ok"


@pytest.mark.parametrize(
    ("mode", "level", "detail"),
    [("ok", Level.OK, ""), ("fail", Level.FAIL, "503"), ("hang", Level.FAIL, "did not answer in 0.5 s")],
)
def test_agent_probe(agent: str, mode: str, level: Level, detail: str) -> None:
    _Agent.mode = mode
    with httpx.Client() as http:
        started = time.monotonic()
        result = signals.probe_agent(http, agent, timeout_s=0.5, threshold=3)
        assert time.monotonic() - started < 2, "the probe must be bounded by its timeout"
    assert result.level is level and detail in result.detail and result.threshold == (3 if level is Level.FAIL else 1)


def test_agent_probe_of_a_closed_port_is_a_failure() -> None:
    from raypod.testing import free_port

    with httpx.Client() as http:
        result = signals.probe_agent(http, f"127.0.0.1:{free_port()}", timeout_s=0.5, threshold=1)
    assert result.level is Level.FAIL and "unreachable" in result.detail


def test_disk_below_the_minimum_fails_and_a_missing_path_is_unknown(tmp_path: object) -> None:
    assert signals.check_disk("/", min_free=1, threshold=3).level is Level.OK
    low = signals.check_disk("/", min_free=2**62, threshold=3)
    assert low.level is Level.FAIL and "free under /" in low.detail
    assert signals.check_disk("/no/such/dir", min_free=1, threshold=3).level is None


def test_memory_over_the_node_budget_and_host_pressure_are_advisory() -> None:
    assert signals.check_memory(None, 100).level is None
    over = signals.check_memory(200 * 2**20, 100 * 2**20)
    assert over.level is Level.WARN and "over its budget of 100 MiB" in over.detail
    assert signals.check_memory(50, 100).level is Level.OK
    assert signals.check_host_memory(available=1, total=100).level is Level.WARN
    assert signals.check_host_memory(available=50, total=100).level is Level.OK


def test_a_hanging_command_is_killed_at_its_timeout_with_its_children() -> None:
    started = time.monotonic()
    result = run_command(["/bin/sh", "-c", "sleep 30 & sleep 30"], timeout_s=0.5)
    assert result.exit_code is None and time.monotonic() - started < 5
    signal = signals.command_signal(result, "slow", timeout_s=0.5, threshold=2)
    assert signal.level is Level.FAIL and signal.detail == "timed out after 0.5 s" and signal.signal == "check:slow"


def test_a_command_that_prints_megabytes_is_truncated() -> None:
    result = run_command(["/bin/sh", "-c", "head -c 20000000 /dev/zero | tr '\\\\0' x; exit 3"], timeout_s=20)
    assert result.exit_code == 3
    assert len(result.output) < 5000 and result.output.endswith("[output truncated]")


def test_a_failing_command_reports_its_exit_code_and_last_line() -> None:
    result = run_command(["/bin/sh", "-c", "echo checking; echo 'disk /data is read-only' >&2; exit 2"], timeout_s=5)
    signal = signals.command_signal(result, "fs", timeout_s=5, threshold=1)
    assert signal.detail == "exit 2: disk /data is read-only"
    assert signals.command_signal(run_command(["true"], timeout_s=5), "ok", timeout_s=5, threshold=1).level is Level.OK
