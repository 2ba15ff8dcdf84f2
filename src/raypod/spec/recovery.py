"""How a cluster's nodes are checked and replaced: recovery settings and user health checks."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field, model_validator

from raypod.spec.values import (
    ByteSize,
    HealthCheckName,
    Strict,
)


class NodeRecovery(StrEnum):
    AUTOMATIC = "automatic"  # an unhealthy node is drained (if it answers), deleted and replaced
    MANUAL = "manual"  # an unhealthy node is reported (event, metric, status); operators replace it


MAX_HEALTH_CHECKS = 8
MAX_HEALTH_CHECK_COMMAND = 4096


class HealthCheckSpec(Strict):
    """A user command run on each node's host every ``period_s``: exit 0 is healthy; a non-zero exit or a
    timeout is a failure, and ``failure_threshold`` failures in a row make the node unhealthy."""

    name: HealthCheckName = Field(description="DNS-1123 label, unique in the spec.")
    command: str = Field(min_length=1, max_length=MAX_HEALTH_CHECK_COMMAND, description="Run with /bin/sh -c.")
    period_s: float = Field(30.0, ge=1, le=3600)
    timeout_s: float = Field(10.0, gt=0, le=600)
    failure_threshold: int = Field(3, ge=1, le=100)

    @model_validator(mode="after")
    def _timeout_within_period(self) -> HealthCheckSpec:
        if self.timeout_s > self.period_s:
            raise ValueError(
                f"health check '{self.name}': timeout_s {self.timeout_s:g} is longer than period_s {self.period_s:g}"
            )
        return self


class RecoverySpec(Strict):
    """Thresholds of the node health model and limits of automatic recovery (docs/resilience.md)."""

    probe_timeout_s: float = Field(2.0, gt=0, le=30, description="Timeout of the node agent's liveness probe.")
    probe_failure_threshold: int = Field(
        5, ge=1, le=100, description="Failed probes in a row (one per reconcile pass) that make a node unhealthy."
    )
    recovery_threshold: int = Field(
        2, ge=1, le=100, description="Good answers in a row a failing signal needs before it counts as healthy."
    )
    min_free_disk: ByteSize = Field(
        512 * 2**20, description="Free space below which the node's session/spill filesystem is a failure."
    )
    drain_timeout_s: float = Field(
        10.0, ge=0, le=3600, description="How long an unhealthy node that still answers is drained first."
    )
    max_replacements: int = Field(
        3, ge=1, le=1000, description="Replacements per group within window_s before the group is held."
    )
    window_s: float = Field(600.0, gt=0, le=7 * 86400)
    quarantine_s: float = Field(
        300.0, ge=0, le=86400, description="How long a replaced node's ports and session dir are not reused."
    )
