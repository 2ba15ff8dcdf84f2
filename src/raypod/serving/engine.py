"""raypod's CPU engine: a transformers causal LM behind a queue, with the tiered KV cache on its prefill.

Prefill always runs in pieces that end on the cache's chunk boundaries, with or without a cache hit: a prefix
read from the cache is then bit-for-bit what the same pieces computed, and greedy outputs are identical with and
without the cache. Requests are taken one at a time by one thread (on CPU a second concurrent forward only
splits the same cores); streaming callers read tokens as they are made.

Keys and values live in one buffer per engine, reused by every request (``KVPool``): a cached prefix is copied
into it once, and each forward appends in place. transformers' default cache concatenates on every step, which
allocates the whole KV again each time; on this 2-core VM those fresh pages cost more than the attention itself.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raypod.serving.kvcache import KVCache, warnings_suppressed

log = logging.getLogger(__name__)


class ContextTooLong(ValueError):
    """The prompt plus the tokens asked for do not fit the model's context."""


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: list[int]
    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    use_cache: bool = True


@dataclass
class Step:
    """One piece of the answer: ``text`` is new text (may be empty while a character is incomplete)."""

    text: str
    token_id: int | None
    finish_reason: str | None = None  # "stop" or "length" on the last step
    usage: dict[str, Any] = field(default_factory=dict)


@dataclass
class Timing:
    """Where one request's time to first token went, as the engine saw it."""

    ttft_s: float = 0.0
    lookup_s: float = 0.0  # reading the cached prefix from the tiers
    cached_tokens: int = 0
    tiers: dict[str, int] = field(default_factory=dict)
    queued_writes: int = 0  # the cache's background writes still pending when the request started
    lookup_parts_s: dict[str, float] = field(default_factory=dict)  # the lookup's parts, as the cache timed them


class KVPool:
    """Keys and values of every layer in one preallocated tensor (layers, 2, 1, kv_heads, capacity, head_dim),
    grown when a request needs more: one allocation for the engine's life instead of one per token."""

    def __init__(self, config: Any, dtype: Any) -> None:
        import torch

        self.torch = torch
        self.layers = int(config.num_hidden_layers)
        heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
        self.shape = (heads, head_dim)
        self.dtype = dtype
        self.buffer = torch.empty((self.layers, 2, 1, heads, 0, head_dim), dtype=dtype)

    @property
    def bytes_per_token(self) -> int:
        return self.layers * 2 * self.shape[0] * self.shape[1] * self.buffer.element_size()

    def reserve(self, tokens: int, chunk_tokens: int) -> None:
        """Allocate room for ``tokens`` now and touch it: fresh memory costs page faults, and on a VM the first
        touch of a page can cost far more (measured here: ~0.8 s for 300 MB), which a request should not pay."""
        if self.buffer.shape[4] < tokens:
            capacity = -(-tokens // chunk_tokens) * chunk_tokens
            self.buffer = self.torch.zeros(
                (self.layers, 2, 1, *self.shape[:1], capacity, self.shape[1]), dtype=self.dtype
            )

    def cache(self, tokens: int, prefix_chunks: list[Any], chunk_tokens: int) -> Any:
        """A fresh transformers cache over the pool, room for ``tokens``, holding the prefix chunks (each
        (layers, 2, kv_heads, chunk, head_dim)) already."""
        from transformers import DynamicCache

        torch = self.torch
        if self.buffer.shape[4] < tokens:
            capacity = -(-tokens // chunk_tokens) * chunk_tokens
            self.buffer = torch.empty((self.layers, 2, 1, *self.shape[:1], capacity, self.shape[1]), dtype=self.dtype)
        for index, chunk in enumerate(prefix_chunks):
            window = slice(index * chunk_tokens, (index + 1) * chunk_tokens)
            with warnings_suppressed():  # read-only shared memory (L1): only read here
                self.buffer[:, :, 0, :, window].copy_(torch.from_numpy(chunk))
        cache = DynamicCache()
        cache.layers = [
            _pooled_layer_class()(self.buffer[i, 0], self.buffer[i, 1], len(prefix_chunks) * chunk_tokens)
            for i in range(self.layers)
        ]
        return cache


@functools.cache
def _pooled_layer_class() -> type:
    """Built on first use: transformers is imported only where a model is served."""
    from transformers.cache_utils import DynamicLayer

    class PooledLayer(DynamicLayer):
        """A DynamicLayer whose keys and values are views of the pool: ``update`` writes in place."""

        def __init__(self, keys: Any, values: Any, length: int) -> None:
            super().__init__()  # type: ignore[no-untyped-call]
            self._keys, self._values, self._length = keys, values, length
            if length:
                self.is_initialized = True
                self.device = keys.device
                self.keys, self.values = keys[..., :length, :], values[..., :length, :]

        def lazy_initialization(self, key_states: Any, value_states: Any) -> None:
            self.device = key_states.device
            self.keys, self.values = self._keys[..., :0, :], self._values[..., :0, :]
            self.is_initialized = True

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            start, end = self._length, self._length + key_states.shape[-2]
            self._keys[..., start:end, :].copy_(key_states)
            self._values[..., start:end, :].copy_(value_states)
            self._length = end
            self.keys, self.values = self._keys[..., :end, :], self._values[..., :end, :]
            return self.keys, self.values

    return PooledLayer


class Engine:
    def __init__(
        self,
        model_dir: Path,
        model_id: str,
        cache: KVCache | None = None,
        dtype: str = "float32",
        threads: int = 0,
        reserve_tokens: int = 0,
    ) -> None:
        """``reserve_tokens``: keys and values to allocate now (the pool, and the cache's L2 read buffer)."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if threads:
            torch.set_num_threads(threads)
        self.torch = torch
        self.model_id = model_id
        loaded: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
        self.model = loaded.eval()
        self.tokenizer: Any = AutoTokenizer.from_pretrained(model_dir)
        self.max_context = int(getattr(self.model.config, "max_position_embeddings", 2048))
        self.eos_ids = set(_as_list(getattr(self.model.config, "eos_token_id", None)))
        self.cache = cache
        self.chunk = cache.config.chunk_tokens if cache else 256
        self.pool = KVPool(self.model.config, getattr(torch, dtype))
        reserve_tokens = min(reserve_tokens, self.max_context)
        if reserve_tokens:
            self.pool.reserve(reserve_tokens, self.chunk)
            if cache is not None:
                cache.reserve_read_buffer(reserve_tokens, self.pool.bytes_per_token)
        self.timings: list[Timing] = []  # the latest requests' TTFT and cache use, for metrics and tests
        self._lock = threading.Lock()

    # -- the prompt -------------------------------------------------------------------------------------

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    def encode(self, text: str) -> list[int]:
        return [int(i) for i in self.tokenizer(text, add_special_tokens=False)["input_ids"]]

    def check(self, request: GenerationRequest) -> None:
        """Raises ContextTooLong, ValueError (an empty prompt)."""
        if not request.prompt_ids:
            raise ValueError("the prompt is empty")
        needed = len(request.prompt_ids) + request.max_tokens
        if needed > self.max_context:
            raise ContextTooLong(
                f"this model's maximum context length is {self.max_context} tokens; the prompt has "
                f"{len(request.prompt_ids)} tokens and {request.max_tokens} more were asked for"
            )

    # -- generation -------------------------------------------------------------------------------------

    def generate(self, request: GenerationRequest, cancelled: threading.Event | None = None) -> Iterator[Step]:
        """Blocking; one request at a time per engine. Raises ContextTooLong."""
        self.check(request)
        with self._lock, self.torch.inference_mode():
            yield from self._generate(request, cancelled or threading.Event())

    def _generate(self, request: GenerationRequest, cancelled: threading.Event) -> Iterator[Step]:
        torch = self.torch
        started = time.perf_counter()
        tokens = list(request.prompt_ids)
        use_cache = request.use_cache and self.cache is not None
        queued = self.cache.pending_writes() if self.cache is not None else 0
        prefix = self.cache.lookup(tokens) if use_cache and self.cache is not None else None
        looked_up = time.perf_counter()
        kv, prefilled = None, False
        try:
            kv = self.pool.cache(len(tokens) + request.max_tokens, prefix.chunks if prefix else [], self.chunk)
            if prefix is not None:
                prefix.seconds["pool_copy"] = time.perf_counter() - looked_up
            done = prefix.tokens if prefix else 0
            logits = None
            while done < len(tokens):
                end = min(len(tokens), (done // self.chunk + 1) * self.chunk)
                piece = torch.tensor([tokens[done:end]], dtype=torch.long)
                output = self.model(input_ids=piece, cache=kv, use_cache=True, logits_to_keep=1)
                logits = output.logits[0, -1]
                done = end
            assert logits is not None
            prefilled = True
            yield from self._decode(request, tokens, kv, logits, prefix, started, looked_up, queued, cancelled)
        finally:
            # After the answer (the first token is not kept waiting), and before the next request reuses the pool:
            # what L2 served goes to L1 (and its read buffer back to the cache, even after a failure), and the new
            # chunks are copied out here and written to the tiers in the background.
            if prefix is not None and self.cache is not None:
                self.cache.promote(prefix)
            if use_cache and self.cache is not None and prefilled and kv is not None:
                cached_chunks = prefix.tokens // self.chunk if prefix else 0
                layers = [(layer.keys, layer.values) for layer in kv.layers]
                self.cache.store(tokens, layers, cached_chunks, snapshot=True)

    def _decode(
        self,
        request: GenerationRequest,
        tokens: list[int],
        kv: Any,
        logits: Any,
        prefix: Any,
        started: float,
        looked_up: float,
        queued: int,
        cancelled: threading.Event,
    ) -> Iterator[Step]:
        torch = self.torch
        generator = torch.Generator().manual_seed(request.seed) if request.seed is not None else None
        timing = Timing(
            lookup_s=looked_up - started,
            cached_tokens=prefix.tokens if prefix else 0,
            tiers=dict(prefix.tiers) if prefix else {},
            queued_writes=queued,
            lookup_parts_s=dict(prefix.seconds) if prefix else {},
        )
        produced: list[int] = []
        text = ""
        for index in range(request.max_tokens):
            token = self._pick(logits, request, generator)
            if index == 0:
                timing.ttft_s = time.perf_counter() - started
                self._record(timing)
            finish = "stop" if token in self.eos_ids else None
            if finish is None:
                produced.append(token)
            full = str(self.tokenizer.decode(produced, skip_special_tokens=True))
            stop_at = _first_stop(full, request.stop)
            if stop_at is not None:
                full, finish = full[:stop_at], "stop"
            delta = full[len(text) :] if not full.endswith("\ufffd") or finish else ""
            text += delta
            if finish is None and index == request.max_tokens - 1:
                finish = "length"
            if finish is not None or cancelled.is_set():
                yield Step(delta, token, finish or "stop", self._usage(tokens, produced, timing))
                return
            yield Step(delta, token)
            output = self.model(
                input_ids=torch.tensor([[token]], dtype=torch.long), cache=kv, use_cache=True, logits_to_keep=1
            )
            logits = output.logits[0, -1]

    def _pick(self, logits: Any, request: GenerationRequest, generator: Any) -> int:
        torch = self.torch
        if request.temperature <= 0:
            return int(torch.argmax(logits))
        probabilities = torch.softmax(logits.float() / request.temperature, dim=-1)
        if request.top_p < 1.0:
            ordered, order = torch.sort(probabilities, descending=True)
            keep = torch.cumsum(ordered, dim=-1) - ordered < request.top_p
            probabilities = torch.zeros_like(probabilities).scatter(0, order[keep], ordered[keep])
        return int(torch.multinomial(probabilities, 1, generator=generator))

    def _usage(self, prompt: list[int], produced: list[int], timing: Timing) -> dict[str, Any]:
        return {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(produced),
            "total_tokens": len(prompt) + len(produced),
            "prompt_tokens_details": {"cached_tokens": timing.cached_tokens},
        }

    def _record(self, timing: Timing) -> None:
        self.timings.append(timing)
        del self.timings[:-256]

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Step]:
        """The steps of ``generate`` for an asyncio caller; a caller that stops reading stops the generation."""
        self.check(request)
        loop = asyncio.get_running_loop()
        steps: asyncio.Queue[Step | BaseException | None] = asyncio.Queue()
        cancelled = threading.Event()

        def produce() -> None:
            try:
                for step in self.generate(request, cancelled):
                    loop.call_soon_threadsafe(steps.put_nowait, step)
                    if cancelled.is_set():
                        break
            except BaseException as exc:
                loop.call_soon_threadsafe(steps.put_nowait, exc)
            loop.call_soon_threadsafe(steps.put_nowait, None)

        worker = threading.Thread(target=produce, name="raypod-engine", daemon=True)
        worker.start()
        try:
            while (item := await steps.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            cancelled.set()


def _first_stop(text: str, stops: tuple[str, ...]) -> int | None:
    positions = [text.find(stop) for stop in stops if stop and stop in text]
    return min(positions) if positions else None


def _as_list(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list | tuple) else [int(value)]
