"""Issue 28, finding 10: a durable DCP checkpoint is a pickle (``.metadata``); restore never unpickles a copy that
this cluster's key did not sign, and a marker cannot name a file outside the checkpoint. The durable tier is a
local fsspec directory here: what matters is who wrote it, not where it is."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from raypod.checkpoint.dcp import MARKER, TieredReader, TieredWriter
from raypod.checkpoint.format import CorruptCheckpoint
from tests.checkpoint.test_dcp import process_group  # noqa: F401 - a real one-rank gloo group, as DCP runs


class Exploit:
    """Unpickling this writes a file: the proof that a pickle from the bucket ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (exec, (f"open({str(self.marker)!r}, 'w').write('ran')",))


def saved(tmp_path: Path, key: str) -> tuple[Path, Path]:
    local, durable = tmp_path / "local", tmp_path / "durable"
    writer = TieredWriter(local, durable_url=str(durable), key=key)
    dcp.save({"w": torch.ones(4)}, storage_writer=writer)
    assert writer.wait_upload(timeout=60), writer.upload_error
    return local, durable


def test_a_durable_checkpoint_another_tenant_replaced_is_never_unpickled(tmp_path: Path) -> None:
    local, durable = saved(tmp_path, key="ours")
    ran = tmp_path / "pickle-ran"
    (durable / ".metadata").write_bytes(pickle.dumps(Exploit(ran)))
    files = {".metadata": {"bytes": (durable / ".metadata").stat().st_size, "xxh3": 0}}
    (durable / MARKER).write_text(json.dumps({"files": files}))  # unsigned, as a writer without our key makes it
    for path in local.iterdir():
        path.unlink()
    with pytest.raises(CorruptCheckpoint, match="signed"):
        TieredReader(local, str(durable), cache_dir=tmp_path / "cache", key="ours")
    (durable / MARKER).write_text(json.dumps({"files": files, "hmac": "0" * 64}))
    with pytest.raises(CorruptCheckpoint, match="not signed with this cluster's key"):
        TieredReader(local, str(durable), cache_dir=tmp_path / "cache2", key="ours")
    assert not ran.exists()


def test_a_signed_durable_checkpoint_is_restored(tmp_path: Path) -> None:
    local, durable = saved(tmp_path, key="ours")
    for path in local.iterdir():
        path.unlink()
    target = {"w": torch.zeros(4)}
    reader = TieredReader(local, str(durable), cache_dir=tmp_path / "cache", key="ours")
    dcp.load(target, storage_reader=reader)
    assert reader.tier == "durable" and torch.equal(target["w"], torch.ones(4))
    with pytest.raises(CorruptCheckpoint, match="not signed"):
        TieredReader(local, str(durable), cache_dir=tmp_path / "other", key="theirs")


def test_a_marker_cannot_name_a_file_outside_the_checkpoint(tmp_path: Path) -> None:
    local, durable = saved(tmp_path, key="ours")
    outside = tmp_path / "escaped"
    for path in local.iterdir():
        path.unlink()
    (durable / MARKER).write_text(json.dumps({"files": {"../../escaped": {"bytes": 1, "xxh3": 0}}}))
    with pytest.raises(CorruptCheckpoint, match="outside the checkpoint"):
        TieredReader(local, str(durable), cache_dir=tmp_path / "cache" / "x", key="ours")
    assert not outside.exists()
