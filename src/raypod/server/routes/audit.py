"""The audit log's routes, for installation admins (docs/audit.md): entries, the chain's check, an export."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse

from raypod import state
from raypod.controlplane import audit
from raypod.server.auth import Caller
from raypod.server.routes import part

router = APIRouter(prefix="/api/v1", tags=["audit"])
Log = Annotated[audit.AuditLog, part("audit")]


@router.get("/audit")
def list_entries(
    caller: Caller,
    log: Log,
    user: Annotated[str | None, Query(max_length=63)] = None,
    cluster: Annotated[str | None, Query(max_length=127, description="namespace/name")] = None,
    since: datetime | None = None,
    limit: Annotated[int, Query(ge=1, le=10000)] = 200,
) -> list[state.AuditEntry]:
    """The newest entries that match, oldest first."""
    return log.list(caller, user=user, cluster=cluster, since=since, limit=limit)


@router.get("/audit/verify")
def verify(caller: Caller, log: Log) -> state.AuditVerification:
    """Whether every entry is as it was written and none is missing."""
    return log.verify(caller)


@router.get("/audit/export")
def export(caller: Caller, log: Log) -> StreamingResponse:
    """Every entry as JSON lines, oldest first."""
    lines = log.export(caller)
    first = next(lines, "")  # an admin check fails here, before the answer starts

    def everything() -> Iterator[str]:
        if first:
            yield first
        yield from lines

    return StreamingResponse(everything(), media_type="application/x-ndjson")
