"""CheckpointManager with real tiers on this machine: process memory, a local-disk directory, and durable
storage (file:// here; real S3 in test_s3.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from raypod.checkpoint import CheckpointManager, CheckpointNotFound, CorruptCheckpoint, Retention
from raypod.checkpoint.tiers import step_dir


def model_state(seed: int) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(256, 256, generator=generator), "b": torch.randn(256, generator=generator), "step": seed}


def manager(tmp_path: Path, **kwargs: Any) -> CheckpointManager:
    kwargs.setdefault("retention", Retention(memory=2, disk=2, durable=3))
    return CheckpointManager("run", tmp_path / "local", f"file://{tmp_path / 'durable'}", **kwargs)


def test_save_returns_before_persisting_and_restore_prefers_memory(tmp_path: Path) -> None:
    ckpt = manager(tmp_path)
    try:
        for step in range(1, 6):
            saved = ckpt.save(model_state(step), step)
            assert saved.step == step
        assert saved.wait(timeout=60)  # step 5 is persisted: the durable tier holds it now
        assert ckpt.persisted["durable"] == 5 and 5 in ckpt.available()["durable"]
        assert ckpt.wait(timeout=60)
        assert ckpt.available() == {"memory": [4, 5], "disk": [4, 5], "durable": [3, 4, 5]}
        restored = ckpt.restore()
        assert restored is not None and (restored.step, restored.tier) == (5, "memory")
        assert torch.equal(restored.state["w"], model_state(5)["w"]) and restored.state["step"] == 5
        # The memory tier handed step 5's tensors over (no copy); older steps are still there or further down.
        assert ckpt.available()["memory"] == [3, 4]
        older = ckpt.restore(step=3)
        assert older is not None and (older.step, older.tier) == (3, "memory")
        assert torch.equal(older.state["w"], model_state(3)["w"])
        with pytest.raises(CheckpointNotFound, match="step 2 is in no tier"):  # retention deleted it everywhere
            ckpt.restore(step=2)
    finally:
        ckpt.close()


def test_the_snapshot_is_consistent_even_if_training_changes_the_tensors_at_once(tmp_path: Path) -> None:
    ckpt = manager(tmp_path)
    try:
        live = model_state(1)
        ckpt.save(live, 1)
        live["w"].add_(100.0)  # the next optimizer step, right after save() returned
        ckpt.wait()
        assert ckpt.disk is not None
        for tier in (ckpt.memory, ckpt.disk):
            restored = tier.get(1, 0, 1)
            assert torch.equal(restored["w"], model_state(1)["w"]), tier.name
    finally:
        ckpt.close()


def test_a_corrupt_tier_is_skipped_for_the_next_one(tmp_path: Path) -> None:
    ckpt = manager(tmp_path)
    try:
        ckpt.save(model_state(1), 1)
        ckpt.wait()
        ckpt.memory.corrupt(1)
        restored = ckpt.restore()
        assert restored is not None and restored.tier == "disk" and "memory" in restored.skipped
        assert ckpt.disk is not None and ckpt.durable is not None
        ckpt.disk.corrupt(1, 0, 1)
        restored = ckpt.restore()
        assert restored is not None and restored.tier == "durable"
        assert set(restored.skipped) == {"memory", "disk"}
        assert torch.equal(restored.state["w"], model_state(1)["w"])
        ckpt.durable.corrupt(1, 0, 1)
        with pytest.raises(CorruptCheckpoint, match="could not be restored from any tier"):
            ckpt.restore()
    finally:
        ckpt.close()


def test_a_new_process_restores_from_disk_and_nothing_at_all_is_none(tmp_path: Path) -> None:
    first = manager(tmp_path)
    first.save(model_state(2), 2)
    first.close()
    second = manager(tmp_path)
    try:
        restored = second.restore()
        assert restored is not None and (restored.step, restored.tier) == (2, "disk")
    finally:
        second.close()
    empty = CheckpointManager("other", tmp_path / "local")
    try:
        assert empty.restore() is None
    finally:
        empty.close()


def test_a_sharded_step_is_complete_only_when_every_rank_wrote_its_shard(tmp_path: Path) -> None:
    ranks = [manager(tmp_path, rank=rank, world_size=2) for rank in (0, 1)]
    try:
        for step in (1, 2):
            for rank, ckpt in enumerate(ranks):
                if step == 2 and rank == 1:
                    continue  # rank 1 died before saving step 2
                ckpt.save({"shard": torch.full((8,), float(10 * step + rank))}, step)
        for ckpt in ranks:
            ckpt.wait()
        assert ranks[0].available()["durable"] == [1]
        assert ranks[1].available()["durable"] == [1]
        restored = [ckpt.restore(step=1) for ckpt in ranks]
        assert [r.state["shard"][0].item() for r in restored if r] == [10.0, 11.0]
    finally:
        for ckpt in ranks:
            ckpt.close()


def test_a_rank_running_ahead_keeps_its_own_disk_retention_and_leaves_the_others_shards(tmp_path: Path) -> None:
    """Ranks of one node share the local folder; rank 1 saving steps 1..5 while rank 0 stopped at 2 must not
    delete rank 0's shards (a restart restores rank 0 from disk)."""
    ranks = [manager(tmp_path, rank=rank, world_size=2) for rank in (0, 1)]
    try:
        for step in range(1, 6):
            for rank, ckpt in enumerate(ranks):
                if rank == 0 and step > 2:
                    continue
                ckpt.save({"shard": torch.full((8,), float(10 * step + rank))}, step)
                ckpt.wait()
        assert ranks[0].available()["disk"] == [1, 2]
        assert ranks[1].available()["disk"] == [4, 5]
        folders = sorted(p.name for p in (tmp_path / "local" / "run").iterdir())
        assert folders == [step_dir(step) for step in (1, 2, 4, 5)]  # step 3 had only rank 1's shard: gone
    finally:
        for ckpt in ranks:
            ckpt.close()
    restarted = manager(tmp_path, rank=0, world_size=2)
    try:
        restored = restarted.restore(at_most=2)
        assert restored is not None and (restored.step, restored.tier) == (2, "disk")
        assert restored.state["shard"][0].item() == 20.0
    finally:
        restarted.close()


def test_durable_retention_also_deletes_older_incomplete_steps(tmp_path: Path) -> None:
    ranks = [manager(tmp_path, rank=rank, world_size=2) for rank in (0, 1)]
    try:
        for step in range(1, 6):
            for ckpt in reversed(ranks):  # rank 0 last: it deletes in durable storage
                if step == 1 and ckpt.rank == 1:
                    continue  # rank 1 died before uploading step 1: that step can never be restored
                ckpt.save({"shard": torch.full((8,), float(step))}, step)
                ckpt.wait()
        durable = ranks[0].durable
        assert durable is not None
        assert durable.stored_steps() == [3, 4, 5]  # keep=3; the incomplete step 1 went with step 2
    finally:
        for ckpt in ranks:
            ckpt.close()


def test_a_retention_below_one_step_is_refused() -> None:
    with pytest.raises(ValueError, match=r"Retention\.disk must be a whole number of steps, at least 1"):
        Retention(disk=0)


def test_a_failing_tier_is_reported_and_the_others_go_on(tmp_path: Path) -> None:
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the durable directory should be")
    ckpt = CheckpointManager("run", tmp_path / "local", f"file://{blocked}")
    try:
        ckpt.save(model_state(1), 1)
        ckpt.wait()
        assert "durable" in ckpt.errors and ckpt.persisted["disk"] == 1
        restored = ckpt.restore()
        assert restored is not None and restored.step == 1
    finally:
        ckpt.close()


def test_a_tier_that_cannot_be_listed_is_an_error_not_an_empty_tier(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt = manager(tmp_path)
    try:
        ckpt.save(model_state(1), 1)
        ckpt.wait()
        assert ckpt.durable is not None

        def refuse(*_args: object, **_kwargs: object) -> list[str]:
            raise PermissionError("listing denied")

        monkeypatch.setattr(ckpt.durable.fs, "ls", refuse)
        with pytest.raises(PermissionError):
            ckpt.durable.steps(0, 1)
        unlisted: dict[str, str] = {}
        # Both file tiers are local here, so both share the refusing file system.
        assert ckpt.available(unlisted) == {"memory": [1]}
        assert "listing denied" in unlisted["durable"] and "listing denied" in unlisted["disk"]
        restored = ckpt.restore()
        assert restored is not None and restored.tier == "memory"
        assert "listing denied" in restored.skipped["durable"]
    finally:
        ckpt.close()


def test_a_failed_retention_delete_is_logged_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ckpt = manager(tmp_path)
    try:
        assert ckpt.disk is not None

        def refuse(*_args: object, **_kwargs: object) -> None:
            raise OSError("read-only file system")

        monkeypatch.setattr(ckpt.disk.fs, "rm_file", refuse)
        for step in range(1, 6):
            ckpt.save(model_state(step), step)
            ckpt.wait()
        assert ckpt.retention_failures.get("disk", 0) >= 1
        assert "deleting old steps failed" in caplog.text and "read-only file system" in caplog.text
        assert ckpt.restore() is not None  # training and restores go on
    finally:
        ckpt.close()
