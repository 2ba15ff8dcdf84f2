"""The OpenAI-compatible API on Ray Serve for raypod's CPU engine: ``/v1/models``, ``/v1/completions`` and
``/v1/chat/completions``, streamed by server-sent events when asked.

Client mistakes (a prompt over the context, a bad field, an unknown model) are answered 400/404 in OpenAI's error
format, so the official clients raise their usual exceptions; nothing a client sends produces a 5xx.
"""

# No ``from __future__ import annotations`` here: Serve rebuilds the routes inside each replica, where FastAPI
# must see the request models themselves, not their names.
import json
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from ray import serve

from raypod.serving import loader
from raypod.serving.engine import ContextTooLong, Engine, GenerationRequest, Step
from raypod.serving.kvcache import KVCache, KVCacheConfig
from raypod.serving.settings import ServeSettings

log = logging.getLogger(__name__)


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: int | None = Field(None, ge=1, le=32768)
    max_completion_tokens: int | None = Field(None, ge=1, le=32768)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=1, description="One choice per request.")
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None

    def generation(self, prompt_ids: list[int], default_tokens: int) -> GenerationRequest:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return GenerationRequest(
            prompt_ids=prompt_ids,
            max_tokens=self.max_completion_tokens or self.max_tokens or default_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
            stop=stop[:4],
            use_cache=not bool((self.model_extra or {}).get("raypod_no_cache")),
        )


class CompletionRequest(_Request):
    prompt: str | list[int]


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(str(part.get("text", "")) for part in self.content if part.get("type") == "text")


class ChatRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)


class OpenAIError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.code = status, message, kind, code


def error_body(message: str, kind: str, code: str | None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


app = FastAPI(title="raypod OpenAI-compatible API")


@app.exception_handler(OpenAIError)
async def _openai_error(request: Request, exc: OpenAIError) -> JSONResponse:
    return JSONResponse(error_body(exc.message, exc.kind, exc.code), status_code=exc.status)


@app.exception_handler(RequestValidationError)
async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {}
    where = ".".join(str(p) for p in first.get("loc", ())[1:])
    message = f"{where}: {first.get('msg', 'invalid request')}" if where else str(first.get("msg", "invalid request"))
    return JSONResponse(error_body(message, "invalid_request_error", None, where or None), status_code=400)


class OpenAIServer:
    """One replica: stages the model onto its node, loads it, and answers with the KV cache in front of it."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = ServeSettings.model_validate(settings)
        entry = self.settings.entry
        self.model_id = entry.id
        self.created = int(time.time())
        self.replica, self.node = _where()
        path = loader.stage(entry)
        cache = None
        if self.settings.kv_cache:
            cache = KVCache(
                KVCacheConfig(
                    model_id=f"{entry.id}@{entry.digest()}",
                    dtype=entry.dtype,
                    chunk_tokens=self.settings.chunk_tokens,
                    l1_bytes=self.settings.l1_bytes,
                    l2_url=self._l2_url(),
                ),
                metric=_ray_metric(entry.id),
            )
        self.engine = Engine(
            Path(path),
            entry.id,
            cache,
            dtype=entry.dtype,
            threads=self.settings.threads,
            reserve_tokens=self.settings.reserve_tokens,
        )
        self._ttft = _ray_histogram(entry.id)

    def _l2_url(self) -> str | None:
        if self.settings.l2_url_file:
            try:
                return Path(self.settings.l2_url_file).read_text().strip() or None
            except OSError as exc:
                log.warning("KV cache L2 address file unreadable (%s): serving from L1 only", exc)
                return None
        return self.settings.l2_url

    # The API's verbs; OpenAIDeployment binds them to routes.

    async def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [self._model_card()]}

    async def model(self, model: str) -> dict[str, Any]:
        self._check_model(model)
        return self._model_card()

    async def completions(self, body: CompletionRequest) -> Any:
        self._check_model(body.model)
        ids = list(body.prompt) if isinstance(body.prompt, list) else self.engine.encode(body.prompt)
        return await self._answer(body, ids, chat=False)

    async def chat(self, body: ChatRequest) -> Any:
        self._check_model(body.model)
        ids = self.engine.encode_chat([{"role": m.role, "content": m.text()} for m in body.messages])
        return await self._answer(body, ids, chat=True)

    async def health(self) -> dict[str, str]:
        return {"status": "ok"}

    # -- internals ---------------------------------------------------------------------------------------

    def _model_card(self) -> dict[str, Any]:
        entry = self.settings.entry
        return {
            "id": self.model_id,
            "object": "model",
            "created": self.created,
            "owned_by": "raypod",
            "max_model_len": entry.max_context,
        }

    def _trace(self) -> dict[str, Any]:
        """Where the answer came from (an extension field; OpenAI clients keep unknown fields): which replica, on
        which node, and how much of the prompt each cache tier held."""
        timing = self.engine.timings[-1] if self.engine.timings else None
        return {
            "replica": self.replica,
            "node": self.node,
            "pid": os.getpid(),
            "cached_tokens": timing.cached_tokens if timing else 0,
            "cache_chunks": timing.tiers if timing else {},
            "engine_ttft_ms": round(timing.ttft_s * 1000, 1) if timing else None,
            "lookup_ms": round(timing.lookup_s * 1000, 1) if timing else None,
            "queued_writes": timing.queued_writes if timing else 0,
            "lookup_parts_ms": {k: round(v * 1000, 1) for k, v in timing.lookup_parts_s.items()} if timing else {},
        }

    def _check_model(self, model: str) -> None:
        if model != self.model_id:
            raise OpenAIError(
                404,
                f"The model '{model[:200]}' does not exist here; this endpoint serves '{self.model_id}'",
                "invalid_request_error",
                "model_not_found",
            )

    async def _answer(self, body: _Request, ids: list[int], chat: bool) -> Any:
        if any(not 0 <= i < self.engine.model.config.vocab_size for i in ids):
            raise OpenAIError(400, "prompt token ids must lie inside the model's vocabulary", code="invalid_prompt")
        request = body.generation(ids, default_tokens=16)
        try:
            self.engine.check(request)
        except ContextTooLong as exc:
            raise OpenAIError(400, str(exc), code="context_length_exceeded") from None
        except ValueError as exc:
            raise OpenAIError(400, str(exc)) from None
        completion_id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        started = time.perf_counter()
        steps = self.engine.stream(request)
        if body.stream:
            include_usage = bool((body.stream_options or {}).get("include_usage"))
            return StreamingResponse(
                self._events(steps, completion_id, chat, include_usage, started),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        text, last = "", None
        async for step in steps:
            if last is None:
                self._ttft(time.perf_counter() - started, self.engine)
            text += step.text
            last = step
        assert last is not None
        choice: dict[str, Any] = {"index": 0, "finish_reason": last.finish_reason, "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return {
            "id": completion_id,
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.model_id,
            "choices": [choice],
            "usage": last.usage,
            "raypod": self._trace(),
        }

    async def _events(
        self, steps: AsyncIterator[Step], completion_id: str, chat: bool, include_usage: bool, started: float
    ) -> AsyncIterator[bytes]:
        created = int(time.time())
        kind = "chat.completion.chunk" if chat else "text_completion"
        first = first_chunk = True
        usage: dict[str, Any] = {}
        try:
            async for step in steps:
                if first:
                    self._ttft(time.perf_counter() - started, self.engine)
                choice: dict[str, Any] = {"index": 0, "finish_reason": step.finish_reason, "logprobs": None}
                if chat:
                    choice["delta"] = {"role": "assistant", "content": step.text} if first else {"content": step.text}
                else:
                    choice["text"] = step.text
                first = False
                usage = step.usage or usage
                chunk = {"id": completion_id, "object": kind, "created": created, "model": self.model_id}
                if "delta" not in choice or "role" in choice["delta"]:
                    chunk["raypod"] = self._trace() if first_chunk else None
                first_chunk = False
                yield _sse({key: value for key, value in {**chunk, "choices": [choice]}.items() if value is not None})
            if include_usage:
                yield _sse(
                    {
                        "id": completion_id,
                        "object": kind,
                        "created": created,
                        "model": self.model_id,
                        "choices": [],
                        "usage": usage,
                    }
                )
            yield b"data: [DONE]\n\n"
        except Exception as exc:  # after the headers: the error goes into the stream, where clients look for it
            log.exception("generation failed")
            yield _sse(error_body(f"generation failed: {type(exc).__name__}", "server_error", "generation_failed"))


def _where() -> tuple[str, str]:
    try:
        from ray import serve as ray_serve
        from ray.runtime_context import get_runtime_context

        return ray_serve.get_replica_context().replica_id.unique_id, get_runtime_context().get_node_id()
    except Exception:  # outside a Serve replica (tests of the class itself)
        return "local", "local"


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def _ray_metric(model: str) -> Any:
    """KV cache counters as Ray metrics (exported by the node's metrics agent, so Prometheus finds them)."""
    try:
        from ray.util import metrics
    except ImportError:
        return None
    counters: dict[str, Any] = {}
    gauges: dict[str, Any] = {}

    def record(name: str, value: float, tags: dict[str, str]) -> None:
        tags = {**tags, "model": model}
        gauge = tags.pop("gauge", None)
        keys = tuple(sorted(tags))
        try:
            if gauge:
                metric = gauges.get(name) or gauges.setdefault(
                    name, metrics.Gauge(f"raypod_{name}", f"raypod {name}", tag_keys=keys)
                )
                metric.set(value, tags=tags)
            else:
                metric = counters.get(name + str(keys)) or counters.setdefault(
                    name + str(keys), metrics.Counter(f"raypod_{name}", f"raypod {name}", tag_keys=keys)
                )
                metric.inc(value, tags=tags)
        except Exception as exc:
            log.debug("metric %s not recorded: %s", name, exc)

    return record


def _ray_histogram(model: str) -> Any:
    try:
        from ray.util import metrics

        histogram = metrics.Histogram(
            "raypod_serve_ttft_seconds",
            "Time to first token of raypod's CPU engine, by the KV cache tier that held the prefix",
            boundaries=[0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16],
            tag_keys=("model", "tier"),
        )
    except Exception:
        histogram = None

    def observe(seconds: float, engine: Engine) -> None:
        timing = engine.timings[-1] if engine.timings else None
        tier = "none"
        if timing is not None and timing.cached_tokens:
            tier = "l2" if timing.tiers.get("l2") else "l1"
        if histogram is not None:
            histogram.observe(seconds, tags={"model": model, "tier": tier})

    return observe


@serve.deployment(name="openai", health_check_period_s=5, health_check_timeout_s=10)
@serve.ingress(app)
class OpenAIDeployment(OpenAIServer):
    @app.get("/v1/models")
    async def _models(self) -> dict[str, Any]:
        return await self.models()

    @app.get("/v1/models/{model:path}")
    async def _model(self, model: str) -> dict[str, Any]:
        return await self.model(model)

    @app.post("/v1/completions")
    async def _completions(self, body: CompletionRequest) -> Any:
        return await self.completions(body)

    @app.post("/v1/chat/completions")
    async def _chat(self, body: ChatRequest) -> Any:
        return await self.chat(body)

    @app.get("/health")
    async def _health(self) -> dict[str, str]:
        return await self.health()


def deployment(settings: ServeSettings, options: dict[str, Any]) -> Any:
    """The Serve application of one model, with Serve options (replicas, autoscaling, resources) applied."""
    configured: Any = OpenAIDeployment
    return configured.options(**options).bind(settings.model_dump(mode="json"))
