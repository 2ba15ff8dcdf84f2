"""A team's (or namespace's) quota."""

from __future__ import annotations

from enum import StrEnum

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
)

from raypod.spec.values import (
    ByteSize,
)


class QuotaPolicy(StrEnum):
    QUEUE = "queue"  # work beyond the quota waits in the queue
    REJECT = "reject"  # work beyond the quota is refused


class QuotaSpec(BaseModel):
    """A team's limits on what its clusters may hold together; an absent limit is no limit."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    cpus: float | None = Field(None, ge=0, le=1_000_000, description="Ray CPUs of all nodes together.")
    memory: ByteSize | None = Field(None, description="Ray memory plus object store of all nodes together.")
    gpus: int | None = Field(None, ge=0, le=100_000)
    clusters: int | None = Field(None, ge=0, le=100_000)
    nodes: int | None = Field(None, ge=0, le=1_000_000)
    policy: QuotaPolicy = QuotaPolicy.QUEUE
    borrow: bool = Field(False, description="May use quota other teams leave idle (given back on demand).")
