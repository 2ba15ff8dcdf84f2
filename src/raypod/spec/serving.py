"""A model deployment: a catalog model on a cluster's Ray Serve."""

from __future__ import annotations

import re

from pydantic import (
    Field,
    field_validator,
)

from raypod.spec.values import (
    MAX_CPUS_PER_NODE,
    ByteSize,
    DeploymentName,
    Strict,
)

MAX_SERVE_REPLICAS = 64
DEFAULT_RESERVE_TOKENS = 8192


class ServeDeploySpec(Strict):
    """A catalog model on a cluster's Ray Serve, behind the OpenAI-compatible API."""

    model: str = Field(min_length=1, max_length=129, description="A catalog model id (`raypod model list`).")
    name: DeploymentName | None = Field(None, description="The application's name and route (default: the model id).")
    replicas: int = Field(1, ge=1, le=MAX_SERVE_REPLICAS)
    autoscale: tuple[int, int] | None = Field(None, description="(min, max) replicas; replaces `replicas`.")
    cpus: float = Field(1.0, ge=0, le=MAX_CPUS_PER_NODE, description="Logical CPUs per replica.")
    engine: str = Field("auto", pattern="^(auto|cpu|vllm)$", description="vLLM where the cluster has GPUs.")
    kv_cache: bool = True
    l1_bytes: ByteSize | None = Field(None, description="Per-node L1 pool; default: half the object store.")
    l2: str | None = Field(
        None,
        max_length=2048,
        description="Shared tier: a redis:// or fsspec URL, 'none', or unset for a Redis raypod runs.",
    )
    l2_bytes: ByteSize = Field(2 * 2**30, description="Memory of the Redis raypod runs for L2.")
    chunk_tokens: int = Field(256, ge=16, le=8192)
    reserve_tokens: int | None = Field(
        None,
        ge=0,
        le=1_048_576,
        description=(
            "Tokens of keys and values each replica of the CPU engine allocates when it starts (its working pool, "
            "and its L2 read buffer): the first long prompt then finds them ready. Default: the model's context, "
            "up to 8192; 0: grow on demand."
        ),
    )

    def reserved_tokens(self, max_context: int) -> int:
        """What a replica reserves: never more than the model's context."""
        return min(max_context, DEFAULT_RESERVE_TOKENS if self.reserve_tokens is None else self.reserve_tokens)

    @field_validator("autoscale")
    @classmethod
    def _autoscale(cls, value: tuple[int, int] | None) -> tuple[int, int] | None:
        if value is not None and not (0 <= value[0] <= value[1] <= MAX_SERVE_REPLICAS and value[1] >= 1):
            raise ValueError(f"autoscale is MIN:MAX with 0 <= MIN <= MAX <= {MAX_SERVE_REPLICAS} and MAX >= 1")
        return value

    def app_name(self) -> str:
        if self.name:
            return self.name
        cleaned = re.sub(r"[^a-z0-9-]+", "-", self.model.lower().split("/")[-1]).strip("-")[:40].strip("-")
        return cleaned or "model"


def parse_autoscale(value: str) -> tuple[int, int]:
    """``MIN:MAX``. Raises ValueError."""
    low, sep, high = value.partition(":")
    if not sep or not low.strip().isdigit() or not high.strip().isdigit():
        raise ValueError(f"autoscale must be MIN:MAX (e.g. 1:4), not {value!r}")
    return int(low), int(high)
