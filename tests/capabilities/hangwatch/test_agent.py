"""The agent on real files and real processes: a rank here is a real Python process (py-spy dumps it, cancel
kills it), its progress file and log written as a Ray Train worker's would be. No Ray: the agent never talks
to Ray, and the e2e tests run it on real clusters."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raypod.capabilities.hangwatch import agent as agent_mod
from raypod.capabilities.hangwatch import diagnostics, layout, logs


@pytest.fixture
def rank_process(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    log = open(tmp_path / "worker.out", "ab")  # noqa: SIM115 - the child's stdout
    child = subprocess.Popen(
        [sys.executable, "-c", "import time\ndef train_func():\n    time.sleep(600)\ntrain_func()"], stdout=log
    )
    log.close()
    yield child
    child.kill()
    child.wait()


def write_rank(root: Path, pid: int, log: Path, **fields: Any) -> None:
    now = time.time()
    layout.write_json(
        layout.ranks_dir(root) / f"{pid}.json",
        {
            "pid": pid,
            "run_id": "r" * 32,
            "run": "demo",
            "attempt": "a" * 16,
            "job_id": "02000000",
            "raypod_job": "rj-0123456789",
            "rank": 0,
            "world_size": 1,
            "node": "cpu-0",
            "started": now - 30,
            "clock": now - 30,
            "reports": 2,
            "last_report": now - 30,
            "slowest_step_s": 1.0,
            "paused": None,
            "log": str(log),
            **fields,
        },
    )


def request(root: Path, action: str) -> None:
    layout.write_json(
        root / "requests" / "req-1.json",
        {
            "run_id": "r" * 32,
            "attempt": "a" * 16,
            "kind": "hang",
            "reason": "no progress",
            "ranks": [0],
            "last_progress": time.time() - 30,
            "timeout_s": 20,
            "hangs_without_progress": 1,
            "action": action,
        },
    )


def test_a_hang_request_gets_stacks_a_log_line_and_with_cancel_the_rank_killed(
    tmp_path: Path, rank_process: subprocess.Popen[bytes]
) -> None:
    if diagnostics.find_py_spy() is None:
        pytest.skip("py-spy is not installed")
    log = tmp_path / "worker.out"
    log.write_text("loading data\nstep 1\n")
    write_rank(tmp_path, rank_process.pid, log)
    agent = agent_mod.Agent(tmp_path)
    agent.poll(time.time())
    status = layout.read_json(tmp_path / "status.json")
    assert status is not None and status["runs"][0]["ranks"][0]["stalled_s"] >= 29
    request(tmp_path, "cancel")
    time.sleep(0.5)  # the child has entered its sleep
    agent.poll(time.time())
    [detection_file] = list(layout.detections_dir(tmp_path).glob("*.json"))
    detection = layout.read_json(detection_file)
    assert detection is not None and detection["action"] == "cancel"
    [rank] = detection["ranks"]
    assert "train_func" in (rank["stack"] or ""), rank["stack_error"]
    assert rank["log_tail"][-1] == "step 1"
    assert detection["diagnostics_s"] < 10
    assert rank_process.wait(timeout=10) == -9
    assert "[raypod hangwatch] hang detected" in log.read_text()
    assert not list((tmp_path / "requests").glob("*.json")), "a handled request is removed"
    request(tmp_path, "cancel")  # the control plane, restarted, hands it over again
    agent.poll(time.time())  # handled once: no second detection
    assert len(list(layout.detections_dir(tmp_path).glob("*.json"))) == 1


def test_without_py_spy_the_detection_says_so_and_still_happens(
    tmp_path: Path, rank_process: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(diagnostics, "find_py_spy", lambda: None)
    log = tmp_path / "worker.out"
    write_rank(tmp_path, rank_process.pid, log)
    request(tmp_path, "notify")
    agent_mod.Agent(tmp_path).poll(time.time())
    [detection_file] = list(layout.detections_dir(tmp_path).glob("*.json"))
    detection = layout.read_json(detection_file)
    assert detection is not None
    assert "py-spy is not installed" in detection["ranks"][0]["stack_error"]
    assert rank_process.poll() is None, "notify kills nothing"


def test_a_restarted_agent_keeps_its_rule_clocks_and_log_offset(
    tmp_path: Path, rank_process: subprocess.Popen[bytes]
) -> None:
    log = tmp_path / "worker.out"
    log.write_text("step 1\n")
    rule = {"name": "step", "log_pattern": r"step \d+", "timeout_seconds": 300}
    write_rank(tmp_path, rank_process.pid, log, run_overrides={"rules": [rule]})
    first = agent_mod.Agent(tmp_path)
    first.poll(time.time())
    matched = first.rules[str(rank_process.pid)]["step"].last_match
    assert matched is not None
    second = agent_mod.Agent(tmp_path)  # a new process would start exactly so, from state.json
    assert second.rules[str(rank_process.pid)]["step"].last_match == matched
    assert second.offsets[str(rank_process.pid)] == len("step 1\n")
    second.poll(time.time() + 5)
    assert second.rules[str(rank_process.pid)]["step"].last_match == matched, "no line read twice"


def test_a_megabyte_line_and_a_pathological_pattern_do_not_stall_a_poll(
    tmp_path: Path, rank_process: subprocess.Popen[bytes]
) -> None:
    log = tmp_path / "worker.out"
    with open(log, "w") as handle:
        handle.write("a" * 8 * 2**20 + "!\n" + "step 2\n")
    rule = {"name": "evil", "log_pattern": "(a+)+$", "timeout_seconds": 300}
    write_rank(tmp_path, rank_process.pid, log, run_overrides={"rules": [rule]})
    agent = agent_mod.Agent(tmp_path)
    started = time.perf_counter()
    for _ in range(3):  # at most MAX_READ_BYTES a poll
        agent.poll(time.time())
    assert time.perf_counter() - started < 3.0
    assert agent.offsets[str(rank_process.pid)] == os.path.getsize(log)


def test_the_tail_cuts_long_lines_and_reads_a_bounded_amount_per_call(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"x" * (logs.MAX_LINE_BYTES * 3) + b"\nshort\npartial")
    tail = logs.LogTail(str(path))
    lines = tail.read()
    assert [len(line) for line in lines] == [logs.MAX_LINE_BYTES, 5]
    with open(path, "ab") as handle:
        handle.write(b" line\n")
    assert tail.read() == ["partial line"]
    big = tmp_path / "big"
    big.write_bytes(b"line\n" * (logs.MAX_READ_BYTES // 5 + 1000))
    reader = logs.LogTail(str(big))
    reader.read()
    assert reader.offset == logs.MAX_READ_BYTES
    assert logs.last_lines(str(path))[-1] == "partial line"
