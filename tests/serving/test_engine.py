"""The CPU engine on a real (tiny, random) Llama: greedy answers are identical token by token with and without
the cache, from L1 and from L2, and a prompt over the context is refused before any compute."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from raypod.serving.engine import ContextTooLong, Engine, GenerationRequest
from raypod.serving.kvcache import KVCache, KVCacheConfig

CHUNK = 32


def tokens_of(engine: Engine, count: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, engine.model.config.vocab_size) for _ in range(count)]


def answer(engine: Engine, prompt: list[int], **kwargs: object) -> list[int | None]:
    return [step.token_id for step in engine.generate(GenerationRequest(prompt, max_tokens=24, **kwargs))]  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def engines(tiny_model: Path, redis_url: str) -> tuple[Engine, Engine, Engine]:
    def cache() -> KVCache:
        return KVCache(KVCacheConfig(model_id="tiny", chunk_tokens=CHUNK, l1="process", l2_url=redis_url))

    plain = Engine(tiny_model, "tiny", None)
    plain.chunk = CHUNK
    return plain, Engine(tiny_model, "tiny", cache()), Engine(tiny_model, "tiny", cache())


def test_greedy_outputs_are_identical_with_and_without_the_cache_from_each_tier(
    engines: tuple[Engine, Engine, Engine],
) -> None:
    plain, first, second = engines
    prompt = tokens_of(plain, 5 * CHUNK + 7)
    expected = answer(plain, prompt)
    assert answer(first, prompt) == expected  # a miss: computes and stores
    assert first.cache is not None
    first.cache.flush()
    assert answer(first, prompt) == expected  # from L1
    assert first.timings[-1].cached_tokens == 5 * CHUNK and first.timings[-1].tiers.get("l1") == 5
    assert answer(second, prompt) == expected  # another replica: from L2
    assert second.timings[-1].tiers.get("l2") == 5
    follow_up = prompt + [int(t) for t in expected if t is not None] + tokens_of(plain, 40, seed=1)
    assert answer(second, follow_up) == answer(plain, follow_up), "a longer turn reuses the shared prefix"
    assert second.timings[-1].cached_tokens >= 5 * CHUNK


def test_sampling_with_a_seed_repeats_and_stop_strings_end_the_text(engines: tuple[Engine, Engine, Engine]) -> None:
    plain, first, _ = engines
    prompt = tokens_of(plain, 50, seed=3)
    sampled = answer(first, prompt, temperature=0.8, top_p=0.9, seed=7)
    assert sampled == answer(first, prompt, temperature=0.8, top_p=0.9, seed=7)
    steps = list(plain.generate(GenerationRequest(prompt, max_tokens=40)))
    text = "".join(step.text for step in steps)
    assert len(text) > 4, text
    stop = text[2:4]
    stopped = "".join(s.text for s in plain.generate(GenerationRequest(prompt, max_tokens=40, stop=(stop,))))
    assert stop not in stopped and text.startswith(stopped)
    assert steps[-1].finish_reason in ("stop", "length") and steps[-1].usage["prompt_tokens"] == 50


def test_a_prompt_over_the_context_is_refused_before_any_compute(engines: tuple[Engine, Engine, Engine]) -> None:
    plain, _, _ = engines
    with pytest.raises(ContextTooLong, match="maximum context length is 1024"):
        list(plain.generate(GenerationRequest(tokens_of(plain, 1020), max_tokens=10)))
    with pytest.raises(ValueError, match="empty"):
        list(plain.generate(GenerationRequest([], max_tokens=1)))


def test_a_reserving_engine_reads_l2_into_memory_it_allocated_at_start(tiny_model: Path, redis_url: str) -> None:
    def cache() -> KVCache:
        return KVCache(KVCacheConfig(model_id="tiny-reserve", chunk_tokens=CHUNK, l1="off", l2_url=redis_url))

    writer = Engine(tiny_model, "tiny", cache())
    reader = Engine(tiny_model, "tiny", cache(), reserve_tokens=8 * CHUNK)
    assert reader.pool.buffer.shape[4] == 8 * CHUNK
    assert reader.cache is not None and reader.cache._staging is not None
    reserved = reader.cache._staging.buffer
    assert len(reserved) >= 8 * CHUNK * reader.pool.bytes_per_token
    prompt = tokens_of(writer, 6 * CHUNK + 3, seed=5)
    expected = answer(writer, prompt)
    assert writer.cache is not None
    writer.cache.flush()
    assert answer(reader, prompt) == expected and reader.timings[-1].tiers.get("l2") == 6
    assert reader.cache._staging is not None and reader.cache._staging.buffer is reserved, "nothing new allocated"
    assert reader.pool.buffer.shape[4] == 8 * CHUNK


def test_a_request_that_fails_after_an_l2_hit_gives_the_read_buffer_back(
    tiny_model: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def cache() -> KVCache:
        return KVCache(KVCacheConfig(model_id="tiny-fail", chunk_tokens=CHUNK, l1="off", l2_url=redis_url))

    writer, reader = Engine(tiny_model, "tiny", cache()), Engine(tiny_model, "tiny", cache(), reserve_tokens=4 * CHUNK)
    prompt = tokens_of(writer, 3 * CHUNK + 1, seed=7)
    answer(writer, prompt)
    assert writer.cache is not None and reader.cache is not None
    writer.cache.flush()
    reserved = reader.cache._staging
    monkeypatch.setattr(reader.pool, "cache", lambda *args: (_ for _ in ()).throw(MemoryError("no room")))
    with pytest.raises(MemoryError):
        answer(reader, prompt)
    assert reader.cache._staging is reserved, "the next lookup still reads into the reserved buffer"
