"""PyTorch Distributed Checkpoint with raypod's tiered storage: dcp.save and dcp.async_save to local disk with a
background upload to real S3; dcp.load from the fastest verified copy."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from raypod.checkpoint import CorruptCheckpoint
from raypod.checkpoint.dcp import MARKER, TieredReader, TieredWriter
from raypod.testing import free_port
from tests.checkpoint.conftest import S3

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(autouse=True, scope="module")
def process_group() -> Iterator[None]:
    """A real one-rank gloo group, as DCP runs under torchrun or Ray Train."""
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{free_port()}")
    yield
    dist.destroy_process_group()


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))


def zeros_like(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {key: torch.zeros_like(value) for key, value in module.state_dict().items()}


def test_save_uploads_in_the_background_and_load_prefers_local_disk(s3: S3, tmp_path: Path) -> None:
    net = model()
    local = tmp_path / "step-1"
    writer = TieredWriter(local, durable_url=s3.url("dcp/step-1"), storage_options=s3.options(), key="k")
    dcp.save(net.state_dict(), storage_writer=writer)
    assert (local / MARKER).exists()
    assert writer.wait_upload(timeout=120), writer.upload_error

    target = zeros_like(net)
    reader = TieredReader(local, durable_url=s3.url("dcp/step-1"), storage_options=s3.options())
    dcp.load(target, storage_reader=reader)
    assert reader.tier == "disk"
    assert all(torch.equal(target[k], v) for k, v in net.state_dict().items())

    shutil.rmtree(local)  # the node is gone: load from S3
    target = zeros_like(net)
    reader = TieredReader(local, s3.url("dcp/step-1"), s3.options(), cache_dir=tmp_path / "cache", key="k")
    dcp.load(target, storage_reader=reader)
    assert reader.tier == "durable"
    assert all(torch.equal(target[k], v) for k, v in net.state_dict().items())


def test_async_save_and_a_corrupt_local_copy_falls_back_to_s3(s3: S3, tmp_path: Path) -> None:
    net = model()
    local = tmp_path / "step-2"
    writer = TieredWriter(local, durable_url=s3.url("dcp/step-2"), storage_options=s3.options(), key="k")
    future = dcp.async_save(net.state_dict(), storage_writer=writer)
    future.result(timeout=120)
    assert writer.wait_upload(timeout=120), writer.upload_error
    data = next(p for p in local.iterdir() if p.suffix == ".distcp")
    damaged = bytearray(data.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    data.write_bytes(bytes(damaged))
    target = zeros_like(net)
    reader = TieredReader(local, s3.url("dcp/step-2"), s3.options(), cache_dir=tmp_path / "cache", key="k")
    dcp.load(target, storage_reader=reader)
    assert reader.tier == "durable"
    assert all(torch.equal(target[k], v) for k, v in net.state_dict().items())


def test_an_incomplete_checkpoint_is_never_loaded(tmp_path: Path) -> None:
    local = tmp_path / "step-3"
    dcp.save(model().state_dict(), storage_writer=TieredWriter(local))
    (local / MARKER).unlink()  # as if the writer died before finishing
    with pytest.raises(CorruptCheckpoint, match="marker missing"):
        TieredReader(local)
