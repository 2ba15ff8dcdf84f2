"""A raypod job: one Ray job submission and how it is retried."""

from __future__ import annotations

from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from raypod.spec.hangwatch import MAX_HANG_RULES_METADATA, hang_overrides_from_metadata
from raypod.spec.values import (
    check_runtime_env,
)

MAX_JOB_BACKOFF_S = 300.0
# A job's id: raypod's, or Ray's submission id of one of its attempts (what plain Ray tooling printed).
JOB_ID_PATTERN = r"^(rj-[0-9a-f]{10}|raysubmit_[A-Za-z0-9]{1,64})$"


# A job's metadata key: who submitted it with Ray's tooling through raypod's gateway (the gateway writes it over
# whatever the submission said).
SUBMITTED_BY = "raypod.submitted_by"


class JobSpec(BaseModel):
    """A raypod job: one Ray job submission, resubmitted after a FAILED attempt like KubeRay's ``backoffLimit``."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    entrypoint: str = Field(min_length=1, max_length=16384)
    runtime_env: dict[str, Any] = Field(default_factory=dict)
    metadata: dict[str, str] = Field(default_factory=dict)
    max_retries: int = Field(0, ge=0, le=20, description="Resubmissions after a FAILED attempt (backoffLimit).")
    backoff_s: float = Field(2.0, ge=0, le=MAX_JOB_BACKOFF_S, description="First retry delay; doubles each time.")
    as_rayjob: bool = Field(
        False,
        description="Kubernetes backend: run as a KubeRay RayJob on a cluster of its own shaped as the named one "
        "(backoffLimit = max_retries); KubeRay retries it.",
    )
    keep_cluster: bool = Field(
        False, description="With as_rayjob: keep the RayJob's cluster after the job ends (shutdownAfterJobFinishes)."
    )

    @model_validator(mode="after")
    def _rayjob_options(self) -> JobSpec:
        if self.keep_cluster and not self.as_rayjob:
            raise ValueError("keep_cluster: only a job run as a RayJob (as_rayjob) has a cluster of its own")
        return self

    @field_validator("runtime_env")
    @classmethod
    def _runtime_env(cls, value: dict[str, Any]) -> dict[str, Any]:
        return check_runtime_env(value)

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, value: dict[str, str]) -> dict[str, str]:
        def too_long(key: str, item: str) -> bool:
            return len(item) > (MAX_HANG_RULES_METADATA if key == "raypod.hang_rules" else 1024)

        if len(value) > 64 or any(len(k) > 128 or too_long(k, v) for k, v in value.items()):
            raise ValueError("metadata: at most 64 entries, keys up to 128 and values up to 1024 characters")
        hang_overrides_from_metadata(value)
        return value
