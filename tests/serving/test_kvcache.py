"""The KV cache's keys, tiers and failure modes, on real Redis and real files (L1 across a node's replicas is
the e2e test's: it needs a Ray node)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from raypod.serving import kvcache
from raypod.serving.kvcache import KVCache, KVCacheConfig

CHUNK = 16


def fake_layers(tokens: int, layers: int = 2, heads: int = 2, dim: int = 4, seed: int = 0) -> list[tuple]:
    import torch

    generator = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(1, heads, tokens, dim, generator=generator),
            torch.randn(1, heads, tokens, dim, generator=generator),
        )
        for _ in range(layers)
    ]


class Recorder:
    def __init__(self) -> None:
        self.seen: dict[str, float] = {}

    def __call__(self, name: str, value: float, tags: dict[str, str]) -> None:
        key = name + "".join(f",{k}={v}" for k, v in sorted(tags.items()) if k != "gauge")
        self.seen[key] = self.seen.get(key, 0) + value


def make(l1: str = "process", l2_url: str | None = None, l1_bytes: int = 2**26, **kwargs: object) -> KVCache:
    config = KVCacheConfig(model_id="m", chunk_tokens=CHUNK, l1=l1, l1_bytes=l1_bytes, l2_url=l2_url)
    return KVCache(config, metric=kwargs.get("metric"))  # type: ignore[arg-type]


def test_keys_chain_over_the_prefix_and_differ_by_model_and_dtype() -> None:
    tokens = list(range(40))
    keys = kvcache.chunk_keys("m", "float32", tokens, CHUNK)
    assert len(keys) == 2  # only full chunks
    changed_first = kvcache.chunk_keys("m", "float32", [99, *tokens[1:]], CHUNK)
    assert changed_first[1] != keys[1], "a key names the whole prefix, not its own chunk"
    assert kvcache.chunk_keys("m2", "float32", tokens, CHUNK)[0] != keys[0]
    assert kvcache.chunk_keys("m", "float16", tokens, CHUNK)[0] != keys[0]


def test_a_lookup_returns_the_stored_prefix_bit_for_bit_and_leaves_the_last_token() -> None:
    cache = make()
    tokens = list(range(3 * CHUNK))
    layers = fake_layers(len(tokens))
    cache.store(tokens, layers)
    cache.flush()
    prefix = cache.lookup(tokens)
    assert prefix.tokens == 2 * CHUNK, "the last chunk would leave no token to compute"
    for (keys, values), (want_k, want_v) in zip(prefix.layers(), layers, strict=True):
        assert np.array_equal(keys.numpy(), want_k[:, :, : 2 * CHUNK].numpy())
        assert np.array_equal(values.numpy(), want_v[:, :, : 2 * CHUNK].numpy())
    assert cache.lookup(list(range(1, 3 * CHUNK))).tokens == 0, "another prefix shares nothing"


def test_a_full_l1_evicts_least_recently_used_and_never_fails() -> None:
    one_chunk = 2 * 2 * 2 * CHUNK * 4 * 4  # layers, k/v, heads, tokens, dim, float32
    cache = make(l1_bytes=2 * one_chunk)
    first, second = [1] * (CHUNK + 1), [2] * (CHUNK + 1)
    cache.store(first, fake_layers(CHUNK + 1))
    cache.store(second, fake_layers(CHUNK + 1, seed=1))
    cache.flush()
    assert cache.lookup(first).tokens == CHUNK  # touched: now the most recent
    third = [3] * (CHUNK + 1)
    cache.store(third, fake_layers(CHUNK + 1, seed=2))
    cache.flush()
    assert cache.lookup(second).tokens == 0, "the least recently used entry went"
    assert cache.lookup(first).tokens == CHUNK and cache.lookup(third).tokens == CHUNK
    assert cache.l1 is not None and cache.l1.used_bytes() <= 2 * one_chunk


@pytest.mark.parametrize("tier", ["redis", "files"])
def test_l2_serves_a_prefix_another_cache_computed(tier: str, redis_url: str, tmp_path: Path) -> None:
    url = redis_url if tier == "redis" else f"file://{tmp_path}/kv"
    writer, reader = make(l2_url=url), make(l2_url=url, metric=Recorder())
    tokens = list(range(100, 100 + 2 * CHUNK + 3))
    layers = fake_layers(len(tokens))
    writer.store(tokens, layers)
    writer.flush()
    prefix = reader.lookup(tokens)
    assert prefix.tokens == 2 * CHUNK and prefix.tiers == {"l1": 0, "l2": 2}
    assert np.array_equal(prefix.layers()[1][0].numpy(), layers[1][0][:, :, : 2 * CHUNK].numpy())
    reader.flush()
    assert reader.lookup(tokens).tiers == {"l1": 0, "l2": 2}, "promoted before the request was answered"
    reader.promote(prefix)
    reader.flush()
    assert reader.lookup(tokens).tiers == {"l1": 2}, "an L2 hit is promoted into L1 once answered"


def test_a_corrupt_l2_entry_is_skipped_and_recomputed_never_served(redis_url: str) -> None:
    import redis

    recorder = Recorder()
    writer, reader = make(l2_url=redis_url), make(l2_url=redis_url, metric=recorder)
    tokens = list(range(500, 500 + 2 * CHUNK + 1))
    writer.store(tokens, fake_layers(len(tokens)))
    writer.flush()
    second_key = writer.keys(tokens)[1]
    client = redis.Redis.from_url(redis_url)
    blob = bytearray(client.get(f"raypod:kv:{second_key}") or b"")
    blob[-1] ^= 0xFF  # one flipped bit in the payload
    client.set(f"raypod:kv:{second_key}", bytes(blob))
    prefix = reader.lookup(tokens)
    assert prefix.tokens == CHUNK, "the chunk before the corrupt one is still good"
    assert recorder.seen["kv_cache_corrupt_entries"] == 1
    with pytest.raises(kvcache.CorruptEntry):
        kvcache.decode(bytes(blob))


def test_an_unreachable_l2_degrades_to_l1_with_a_warning_and_a_metric(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from raypod.testing import free_port

    recorder = Recorder()
    url = f"redis://:secret-password@127.0.0.1:{free_port()}/0"
    cache = make(l2_url=url, metric=recorder)
    tokens = list(range(2 * CHUNK + 1))
    with caplog.at_level(logging.WARNING):
        cache.store(tokens, fake_layers(len(tokens)))
        cache.flush()
        assert cache.lookup(tokens).tokens == 2 * CHUNK, "L1 still answers"
    assert recorder.seen.get("kv_cache_l2_errors,operation=write", 0) >= 1
    assert "L2" in caplog.text and "secret-password" not in caplog.text, "the password is never logged"


def test_a_full_write_queue_drops_writes_instead_of_blocking() -> None:
    recorder = Recorder()
    cache = KVCache(KVCacheConfig(model_id="m", chunk_tokens=CHUNK, l1="process", write_queue=1), metric=recorder)
    cache._writes.put(None)  # the writer stops, so what is queued next stays there
    cache._writer.join(timeout=5)
    cache._writes.put_nowait(kvcache._Write(["x"], [], [], 0, to_l2=False))  # the queue (of one) is full
    tokens = list(range(CHUNK + 1))
    cache.store(tokens, fake_layers(len(tokens)))
    assert recorder.seen["kv_cache_dropped_writes"] == 1


def test_config_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="chunk_tokens"):
        KVCacheConfig(model_id="m", chunk_tokens=3)
    with pytest.raises(ValueError, match="l1"):
        KVCacheConfig(model_id="m", l1="gpu")


def test_l2_entries_put_their_arrays_at_aligned_offsets_and_older_entries_still_read() -> None:
    array = np.arange(2 * 3 * 5, dtype=np.float32).reshape(2, 3, 5)
    blob = kvcache.encode(array)
    assert (len(blob) - array.nbytes) % kvcache.ALIGN == 0, "the payload starts at an aligned offset"
    assert np.array_equal(kvcache.decode(blob), array)
    import json
    import struct

    import xxhash

    header = json.dumps({"dtype": "float32", "shape": [2, 3, 5], "xxh3": xxhash.xxh3_64_hexdigest(array.tobytes())})
    unpadded = kvcache.MAGIC + struct.pack("<I", len(header)) + header.encode() + array.tobytes()
    assert np.array_equal(kvcache.decode(unpadded), array), "entries written before the padding still read"


def test_redis_reads_land_in_a_reused_buffer_and_survive_a_dropped_connection(redis_url: str) -> None:
    import redis

    recorder = Recorder()
    writer, reader = make(l2_url=redis_url), make(l1="off", l2_url=redis_url, metric=recorder)
    tokens = list(range(700, 700 + 3 * CHUNK + 1))
    layers = fake_layers(len(tokens))
    writer.store(tokens, layers)
    writer.flush()
    first = reader.lookup(tokens)
    assert first.tiers == {"l2": 3}
    buffer = first.staging.buffer if first.staging is not None else None
    reader.promote(first)
    redis.Redis.from_url(redis_url).client_kill_filter(_type="normal", skipme=True)  # the reader's idle connection
    again = reader.lookup(tokens)
    assert again.tiers == {"l2": 3}, "a connection Redis closed is opened again, without a failure"
    assert again.staging is not None and again.staging.buffer is buffer, "the buffer of the last lookup is reused"
    assert np.array_equal(again.layers()[1][1].numpy(), layers[1][1][:, :, : 3 * CHUNK].numpy())
    assert "kv_cache_l2_errors,operation=read" not in recorder.seen


def test_a_prefix_promoted_in_the_background_is_not_overwritten_by_the_next_read(redis_url: str) -> None:
    """The writer still copies the first prefix into L1 when the next lookup reads: that one gets its own buffer."""
    import threading

    class GatedL1(kvcache.ProcessL1):
        def __init__(self) -> None:
            super().__init__(2**26)
            self.gate = threading.Event()

        def put(self, key: str, array: np.ndarray) -> None:
            self.gate.wait(10)
            super().put(key, array)

    writer = make(l2_url=redis_url)
    config = KVCacheConfig(model_id="m", chunk_tokens=CHUNK, l2_url=redis_url)
    l1 = GatedL1()
    reader = KVCache(config, l1=l1)
    one, two = list(range(900, 900 + 2 * CHUNK + 1)), list(range(950, 950 + 2 * CHUNK + 1))
    layers_one, layers_two = fake_layers(len(one), seed=3), fake_layers(len(two), seed=4)
    writer.store(one, layers_one)
    writer.store(two, layers_two)
    writer.flush()
    first = reader.lookup(one)
    reader.promote(first)  # queued; the writer waits at the gate
    second = reader.lookup(two)
    assert second.tiers["l2"] == 2 and second.staging is not first.staging
    l1.gate.set()
    reader.promote(second)
    reader.flush()
    promoted = reader.lookup(one)
    assert promoted.tiers == {"l1": 2}
    assert np.array_equal(promoted.layers()[0][0].numpy(), layers_one[0][0][:, :, : 2 * CHUNK].numpy())
