"""Shard encoding: any state of tensors and JSON values round-trips; bad bytes are refused, never loaded."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from raypod.checkpoint import format as fmt
from raypod.checkpoint import tiers


def state() -> dict[str, Any]:
    return {
        "model": {"w": torch.randn(4, 3), "b": torch.arange(5, dtype=torch.bfloat16), "empty": torch.empty(0)},
        "optim": {"state": {0: {"exp_avg": torch.ones(2, dtype=torch.float16)}}, "param_groups": [{"lr": 1e-3}]},
        "rng": torch.randint(0, 255, (16,), dtype=torch.uint8),
        "betas": (0.9, 0.999),
        "step": 7,
        "name": "run",
        "flag": None,
    }


def encode(original: dict[str, Any]) -> bytearray:
    skeleton, tensors = fmt.flatten(original)
    snapshot = tiers.Snapshot(tiers.signature(tensors), [t.clone() for t in tensors], step=7, skeleton=skeleton)
    snapshot.metas = [
        fmt.TensorMeta(m.dtype, m.shape, m.offset, m.nbytes, fmt.checksum(t))
        for m, t in zip(fmt.layout(tensors), tensors, strict=True)
    ]
    blob = bytearray(snapshot.header(0, 1))
    for tensor, meta in zip(snapshot.tensors, snapshot.metas, strict=True):
        blob += bytes(fmt.as_bytes(tensor)) + b"\0" * (-meta.nbytes % fmt.ALIGN)
    return blob


def data_start(blob: bytearray) -> int:
    return fmt.decode_header(blob)[1]


def assert_same(left: Any, right: Any) -> None:
    if isinstance(left, torch.Tensor):
        assert isinstance(right, torch.Tensor) and left.dtype == right.dtype and torch.equal(left, right)
    elif isinstance(left, dict):
        assert left.keys() == right.keys()
        for key in left:
            assert_same(left[key], right[key])
    elif isinstance(left, list | tuple):
        assert type(left) is type(right) and len(left) == len(right)
        for a, b in zip(left, right, strict=True):
            assert_same(a, b)
    else:
        assert left == right


def test_a_state_round_trips_with_its_types() -> None:
    original = state()
    header, restored = fmt.decode_shard(encode(original), copy=False)
    assert header["step"] == 7
    assert_same(original, restored)


def test_unsupported_values_are_refused_at_save() -> None:
    with pytest.raises(TypeError, match="cannot checkpoint a set"):
        fmt.flatten({"x": {1, 2}})


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: b.__setitem__(slice(0, 4), b"JUNK"), "bad magic"),
        (lambda b: b.__setitem__(data_start(b) + 5, b[data_start(b) + 5] ^ 0xFF), "does not match its checksum"),
        (lambda b: b.__delitem__(slice(len(b) // 2, None)), "truncated"),
        (lambda b: b.__setitem__(slice(19, 23), b"nope"), "garbled shard header"),
    ],
    ids=["magic", "bit-flip", "truncated", "header"],
)
def test_damaged_shards_are_refused(damage: Any, message: str) -> None:
    blob = encode(state())
    damage(blob)
    with pytest.raises(fmt.CorruptCheckpoint, match=message):
        fmt.decode_shard(blob, copy=False)
