"""A client of Ray's job (and Serve status) REST API on a cluster's dashboard, as a backend provides it
(``Backend.job_api``).

The control plane speaks to Ray jobs only through this: the backend decides where the dashboard is and how
raypod authenticates to it.
"""

from __future__ import annotations

import builtins
from typing import Any, BinaryIO

import httpx

from raypod import errors


class RayJobApi:
    def __init__(self, dashboard_url: str, headers: dict[str, str], http: httpx.Client) -> None:
        self.url = dashboard_url.rstrip("/")
        self.headers = headers
        self.http = http

    def submit(self, body: dict[str, Any]) -> dict[str, Any]:
        return _object(self._call("POST", "/api/jobs/", json=body))

    def info(self, submission_id: str) -> dict[str, Any]:
        return _object(self._call("GET", f"/api/jobs/{submission_id}"))

    def list(self) -> list[dict[str, Any]]:
        found = self._call("GET", "/api/jobs/")
        return found if isinstance(found, list) else []

    def job_summary(self, ray_job_id: str, failures: int = 100) -> dict[str, Any]:
        """What Ray's state API says of one Ray job: its tasks and actors counted by state, and its failed tasks
        with their errors (at most ``failures``)."""
        by_job = {"filter_keys": "job_id", "filter_predicates": "=", "filter_values": ray_job_id}
        found: dict[str, Any] = {}
        for kind in ("tasks", "actors"):
            reply = _object(self._call("GET", f"/api/v0/{kind}/summarize", params=by_job))
            found[kind] = reply.get("data", {}).get("result", {})
        failed = {
            "filter_keys": ["job_id", "state"],
            "filter_predicates": ["=", "="],
            "filter_values": [ray_job_id, "FAILED"],
            "detail": "true",
            "limit": failures,
        }
        reply = _object(self._call("GET", "/api/v0/tasks", params=failed))
        rows = reply.get("data", {}).get("result", {}).get("result", [])
        found["failed_tasks"] = [
            {k: row.get(k) for k in ("name", "func_or_class_name", "error_type", "error_message", "node_id")}
            for row in (rows if isinstance(rows, list) else [])
            if isinstance(row, dict)
        ]
        return found

    def alive_actors(self, limit: int = 1000) -> builtins.list[dict[str, Any]]:
        """The cluster's live actors as Ray's state API lists them (``class_name``, ``ray_namespace``, ``name``)."""
        params = {"filter_keys": "state", "filter_predicates": "=", "filter_values": "ALIVE", "detail": "false"}
        found = _object(self._call("GET", "/api/v0/actors", params={**params, "limit": limit}))
        result = found.get("data", {}).get("result", {}).get("result", [])
        return [actor for actor in result if isinstance(actor, dict)] if isinstance(result, list) else []

    def live_work(self, limit: int = 10) -> builtins.list[str]:
        """What Ray's state API says still runs or waits: tasks not ended (any state but FINISHED and FAILED) and
        placement groups not removed, named (at most ``limit`` of each); empty when nothing does."""
        unfinished = {
            "filter_keys": ["state", "state"],
            "filter_predicates": ["!=", "!="],
            "filter_values": ["FINISHED", "FAILED"],
            "detail": "false",
            "limit": limit,
        }
        kept = {"filter_keys": "state", "filter_predicates": "!=", "filter_values": "REMOVED", "limit": limit}
        found: builtins.list[str] = []
        for kind, params, name in (("tasks", unfinished, "name"), ("placement_groups", kept, "placement_group_id")):
            reply = _object(self._call("GET", f"/api/v0/{kind}", params=params))
            rows = reply.get("data", {}).get("result", {}).get("result", [])
            found += [f"{kind[:-1]} {row.get(name, '?')}" for row in (rows if isinstance(rows, list) else [])]
        return found

    def stop(self, submission_id: str) -> dict[str, Any]:
        return _object(self._call("POST", f"/api/jobs/{submission_id}/stop"))

    def logs(self, submission_id: str) -> str:
        return str(_object(self._call("GET", f"/api/jobs/{submission_id}/logs")).get("logs", ""))

    def serve_applications(self) -> dict[str, Any]:
        """Ray Serve's view of its applications (``GET /api/serve/applications/``), as ``serve status`` shows it."""
        return _object(self._call("GET", "/api/serve/applications/"))

    def package_exists(self, package_name: str) -> bool:
        """Whether the cluster's GCS holds the ``gcs://`` package (a head restarted without fault tolerance has
        lost the ones uploaded before)."""
        try:
            self._call("GET", f"/api/packages/gcs/{package_name}")
        except errors.NotFound:
            return False
        return True

    def upload_package(self, package_name: str, content: bytes | BinaryIO) -> None:
        """Put a ``_ray_pkg_<hash>.zip`` on the cluster's GCS, as Ray's own ``--working-dir`` upload does; a file
        is streamed in chunks."""
        if isinstance(content, bytes):
            self._call("PUT", f"/api/packages/gcs/{package_name}", content=content)
            return
        content.seek(0, 2)
        size = content.tell()
        content.seek(0)
        chunks = iter(lambda: content.read(2**20), b"")
        self._call(
            "PUT", f"/api/packages/gcs/{package_name}", content=chunks, headers_extra={"Content-Length": str(size)}
        )

    def _call(self, method: str, path: str, headers_extra: dict[str, str] | None = None, **kwargs: Any) -> Any:
        """Raises TransientError (dashboard not answering, or a 5xx: Ray cannot take it now), InvalidSpec (Ray
        refused the request)."""
        headers = {**self.headers, **(headers_extra or {})}
        try:
            response = self.http.request(method, f"{self.url}{path}", headers=headers, **kwargs)
        except httpx.HTTPError as exc:
            raise errors.TransientError(f"cluster dashboard is not answering ({type(exc).__name__})") from None
        if response.status_code == 404:
            raise errors.NotFound(f"Ray has no such job ({path})")
        if response.status_code >= 500:  # e.g. "No available agent to submit job, please try again later."
            raise errors.TransientError(
                f"Ray cannot take the request now ({response.status_code}): {response.text[:300]}"
            )
        if response.status_code >= 400:
            raise errors.InvalidSpec(f"Ray refused the request ({response.status_code}): {response.text[:300]}")
        try:
            return response.json() if response.content else {}
        except ValueError:
            raise errors.TransientError(f"cluster dashboard answered {path} with something other than JSON") from None


def _object(payload: Any) -> dict[str, Any]:
    if not isinstance(payload, dict):
        raise errors.TransientError("cluster dashboard answered with an unexpected JSON shape")
    return payload
