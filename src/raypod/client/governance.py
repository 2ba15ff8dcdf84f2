"""The SDK's quotas and queue (docs/governance.md)."""

from __future__ import annotations

import builtins
from typing import Any

from raypod import spec as spec_mod
from raypod import state
from raypod.client._calls import quota_path
from raypod.client._http import Transport


class Quotas:
    """Teams' quotas (team admins set them) and the queue of clusters waiting for admission."""

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def set(
        self, team: str | None, quota: spec_mod.QuotaSpec | dict[str, Any], *, namespace: str | None = None
    ) -> state.QuotaView:
        """A team's quota, or with ``namespace`` (and ``team`` None) a namespace's cap inside its team's."""
        body = quota.model_dump(mode="json", exclude_none=True) if isinstance(quota, spec_mod.QuotaSpec) else quota
        return state.QuotaView.model_validate(self._t.request("PUT", quota_path(team, namespace), json=body))

    def get(self, team: str | None, *, namespace: str | None = None) -> state.QuotaView:
        return state.QuotaView.model_validate(self._t.request("GET", quota_path(team, namespace)))

    def list(self) -> builtins.list[state.QuotaView]:
        """Teams' quotas, then namespaces' own (``namespace`` set)."""
        return [state.QuotaView.model_validate(q) for q in self._t.request("GET", "/api/v1/quotas")]

    def delete(self, team: str | None, *, namespace: str | None = None) -> None:
        self._t.request("DELETE", quota_path(team, namespace))

    def kueue(self) -> builtins.list[dict[str, Any]]:
        """Admins: every quota as Kueue objects (to apply with kubectl where Kueue admits)."""
        found: list[dict[str, Any]] = self._t.request("GET", "/api/v1/quotas/kueue")
        return found

    def queue(self) -> builtins.list[state.QueueEntry]:
        """What waits, in the order it will be admitted, with why."""
        return [state.QueueEntry.model_validate(q) for q in self._t.request("GET", "/api/v1/queue")]
