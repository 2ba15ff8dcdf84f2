"""Scheduled jobs: ``raypod job schedule`` and ``raypod schedule list|get|suspend|resume|delete``."""

from __future__ import annotations

import builtins
from typing import Any

from raypod import spec as spec_mod
from raypod import state
from raypod.client._http import Transport


class Schedules:
    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def create(self, spec: spec_mod.ScheduleSpec | dict[str, Any]) -> state.ScheduleView:
        body = spec.model_dump(mode="json") if isinstance(spec, spec_mod.ScheduleSpec) else spec
        return state.ScheduleView.model_validate(self._t.request("POST", "/api/v1/schedules", json=body))

    def list(self, namespace: str | None = None) -> builtins.list[state.ScheduleView]:
        params = {"namespace": namespace} if namespace else {}
        found = self._t.request("GET", "/api/v1/schedules", params=params)
        return [state.ScheduleView.model_validate(s) for s in found]

    def get(self, name: str, namespace: str = "default") -> state.ScheduleView:
        return state.ScheduleView.model_validate(self._t.request("GET", _path(namespace, name)))

    def suspend(self, name: str, namespace: str = "default") -> state.ScheduleView:
        return state.ScheduleView.model_validate(self._t.request("POST", f"{_path(namespace, name)}/suspend"))

    def resume(self, name: str, namespace: str = "default") -> state.ScheduleView:
        return state.ScheduleView.model_validate(self._t.request("POST", f"{_path(namespace, name)}/resume"))

    def delete(self, name: str, namespace: str = "default") -> None:
        self._t.request("DELETE", _path(namespace, name))


def _path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{namespace}/schedules/{name}"
