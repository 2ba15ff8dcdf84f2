"""The audit log, for installation admins: ``raypod audit list|verify|export`` and ``/api/v1/audit``."""

from __future__ import annotations

import builtins
from datetime import datetime
from typing import Any

from raypod import state
from raypod.client._http import Transport


class Audit:
    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def list(
        self,
        user: str | None = None,
        cluster: str | None = None,
        since: datetime | None = None,
        limit: int = 200,
    ) -> builtins.list[state.AuditEntry]:
        """The newest ``limit`` entries by ``user``, on ``cluster`` (``namespace/name``), since ``since``."""
        params: dict[str, Any] = {"limit": limit}
        if user:
            params["user"] = user
        if cluster:
            params["cluster"] = cluster if "/" in cluster else f"default/{cluster}"
        if since is not None:
            params["since"] = since.isoformat()
        return [state.AuditEntry.model_validate(e) for e in self._t.request("GET", "/api/v1/audit", params=params)]

    def verify(self) -> state.AuditVerification:
        """Whether every entry is as written and none is missing (the hash chain and the head)."""
        return state.AuditVerification.model_validate(self._t.request("GET", "/api/v1/audit/verify"))

    def export(self) -> str:
        """Every entry as JSON lines, oldest first."""
        return self._t.request_text("GET", "/api/v1/audit/export")
