"""raypod's CPU engine: a transformers causal LM behind a queue, with the tiered KV cache on its prefill.

Prefill always runs in pieces that end on the cache's chunk boundaries, with or without a cache hit: a prefix
read from the cache is then bit-for-bit what the same pieces computed, and greedy outputs are identical with and
without the cache. Requests are taken one at a time by one thread (on CPU a second concurrent forward only
splits the same cores); streaming callers read tokens as they are made.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raypod.serving.kvcache import KVCache

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
    ttft_s: float = 0.0
    cached_tokens: int = 0
    tiers: dict[str, int] = field(default_factory=dict)


class Engine:
    def __init__(
        self, model_dir: Path, model_id: str, cache: KVCache | None = None, dtype: str = "float32", threads: int = 0
    ) -> None:
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
        from transformers import DynamicCache

        torch = self.torch
        started = time.perf_counter()
        tokens = list(request.prompt_ids)
        use_cache = request.use_cache and self.cache is not None
        prefix = self.cache.lookup(tokens) if use_cache and self.cache is not None else None
        kv: Any = DynamicCache()
        done = 0
        if prefix is not None and prefix.tokens:
            for index, (keys, values) in enumerate(prefix.layers()):
                kv.update(keys, values, index)
            done = prefix.tokens
        logits = None
        while done < len(tokens):
            end = min(len(tokens), (done // self.chunk + 1) * self.chunk)
            piece = torch.tensor([tokens[done:end]], dtype=torch.long)
            output = self.model(input_ids=piece, cache=kv, use_cache=True, logits_to_keep=1)
            logits = output.logits[0, -1]
            done = end
        assert logits is not None
        if use_cache and self.cache is not None:
            cached_chunks = prefix.tokens // self.chunk if prefix else 0
            self.cache.store(tokens, [(layer.keys, layer.values) for layer in kv.layers], cached_chunks)
        generator = torch.Generator().manual_seed(request.seed) if request.seed is not None else None
        timing = Timing(cached_tokens=prefix.tokens if prefix else 0, tiers=dict(prefix.tiers) if prefix else {})
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
