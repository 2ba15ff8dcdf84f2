"""A scheduled job: a job spec run on a cluster at the times a cron expression names (``raypod job schedule``)."""

from __future__ import annotations

import importlib
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from pydantic import Field, field_validator

from raypod.spec.jobs import JobSpec
from raypod.spec.values import ClusterName, Namespace, ScheduleName, Strict


class ConcurrencyPolicy(StrEnum):
    """As a Kubernetes CronJob's: what a run does while the schedule's previous run is still going."""

    ALLOW = "Allow"  # runs beside it
    FORBID = "Forbid"  # is skipped (and said so)
    REPLACE = "Replace"  # stops it, then runs


def _croniter() -> Any:
    return importlib.import_module("croniter")  # no type stubs


def next_time(cron: str, after: datetime) -> datetime:
    """The first time ``cron`` names after ``after`` (UTC)."""
    found: datetime = _croniter().croniter(cron, after).get_next(datetime)
    return found


def last_due(cron: str, after: datetime, now: datetime) -> datetime | None:
    """The latest time ``cron`` names in ``(after, now]``: however many were missed (a server that was down), one
    run. None when none is due."""
    # Cron names whole minutes: from a second past ``now``, the previous match is the latest one at or before it.
    found: datetime = _croniter().croniter(cron, now + timedelta(seconds=1)).get_prev(datetime)
    return found if found > after else None


class ScheduleSpec(Strict):
    name: ScheduleName = Field(max_length=63)
    namespace: Namespace = Field("default", max_length=63)
    cluster: ClusterName = Field(max_length=63)
    cron: str = Field(max_length=200, description="Five fields (minute hour day-of-month month day-of-week), UTC.")
    job: JobSpec
    concurrency_policy: ConcurrencyPolicy = ConcurrencyPolicy.ALLOW
    history_limit: int = Field(3, ge=0, le=100, description="How many of its latest runs the schedule lists.")
    suspended: bool = False

    @field_validator("cron")
    @classmethod
    def _cron(cls, value: str) -> str:
        value = " ".join(value.split())
        if len(value.split(" ")) != 5 or not _croniter().croniter.is_valid(value):
            raise ValueError(f"'{value}' is not a cron expression of five fields, such as '0 3 * * *'")
        return value
