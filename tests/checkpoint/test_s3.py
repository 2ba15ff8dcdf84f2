"""The durable tier on a real S3-compatible server (SeaweedFS, credentials enforced): restore from S3 alone, a
process killed during the upload, and a bucket this key may not write to."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from raypod.checkpoint import CheckpointManager
from tests.checkpoint.conftest import S3
from tests.checkpoint.test_manager import model_state

pytestmark = pytest.mark.timeout(300)


def test_restore_from_s3_when_the_node_lost_memory_and_disk(s3: S3, tmp_path: Path) -> None:
    writer = CheckpointManager("s3-run", tmp_path / "local", s3.url("tiers"), storage_options=s3.options())
    for step in (1, 2):
        writer.save(model_state(step), step)
    writer.close()
    assert writer.errors == {} and writer.persisted["durable"] == 2
    shutil.rmtree(tmp_path / "local")  # the node is gone
    reader = CheckpointManager("s3-run", tmp_path / "new-node", s3.url("tiers"), storage_options=s3.options())
    try:
        restored = reader.restore()
        assert restored is not None and (restored.step, restored.tier) == (2, "durable")
        assert torch.equal(restored.state["w"], model_state(2)["w"])
    finally:
        reader.close()


CHILD = """
import json, sys, time, torch
from raypod.checkpoint import CheckpointManager
local, url, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
ckpt = CheckpointManager("killed", local, url, storage_options=options)
ckpt.save({"w": torch.ones(1024, 1024)}, 1)
ckpt.wait()
print("step 1 persisted", flush=True)
ckpt.save({"w": torch.randn(64, 1024, 1024)}, 2)   # 256 MiB: its upload takes a while
time.sleep(600)
"""


def test_a_process_killed_during_upload_leaves_the_previous_step_and_no_partial_one(s3: S3, tmp_path: Path) -> None:
    local = tmp_path / "local"
    url = s3.url("killed-run")
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(local), url, json.dumps(s3.options())],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "step 1 persisted"
        manifest = local / "killed" / "step-000000000002" / "shard-00000-of-00001.json"
        deadline = time.monotonic() + 120
        while not manifest.exists():  # step 2 is on local disk: its upload starts now
            assert time.monotonic() < deadline and child.poll() is None
            time.sleep(0.01)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    shutil.rmtree(local)
    survivor = CheckpointManager("killed", tmp_path / "elsewhere", url, storage_options=s3.options())
    try:
        assert survivor.available()["durable"] == [1]
        restored = survivor.restore()
        assert restored is not None and (restored.step, restored.tier) == (1, "durable")
        assert torch.equal(restored.state["w"], torch.ones(1024, 1024))
    finally:
        survivor.close()


def test_a_bucket_without_write_permission_is_a_clear_error_and_training_goes_on(s3: S3, tmp_path: Path) -> None:
    ckpt = CheckpointManager("denied", tmp_path / "local", s3.url("denied"), storage_options=s3.options("reader"))
    try:
        for step in (1, 2):
            ckpt.save(model_state(step), step)
        ckpt.wait()
        assert "Access Denied" in ckpt.errors["durable"] or "PermissionError" in ckpt.errors["durable"]
        assert ckpt.persisted["disk"] == 2 and "durable" not in ckpt.persisted
        restored = ckpt.restore()
        assert restored is not None and restored.step == 2 and restored.tier == "memory"
    finally:
        ckpt.close()
