"""Fuzz the public API from its own OpenAPI spec (schemathesis): no request, however malformed, gets a 5xx.

A real uvicorn server in a thread, with the fake backend, so requests cross real HTTP.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
import uvicorn
from hypothesis import HealthCheck, given, settings

from raypod import config
from raypod.backends.fake import FakeBackend
from raypod.server.app import create_app

# Public: liveness, the login form, and whether single sign-on is on (its other routes answer 404 here: this server
# has none).
PUBLIC_PATHS = ("/healthz", "/login", "/api/v1/sso")


def _serve(tmp: Path) -> tuple[str, str, uvicorn.Server, threading.Thread]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    app = create_app(config.Settings(home=tmp, port=port, tls=False, reconcile_interval_s=0.2), backend=FakeBackend())
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            httpx.get(f"{url}/healthz").raise_for_status()
            break
        except httpx.HTTPError:
            time.sleep(0.05)
    token = json.loads((tmp / "credentials").read_text())["token"]
    return url, token, server, thread


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str]]:
    url, token, server, thread = _serve(tmp_path_factory.mktemp("fuzz"))
    admin = {"Authorization": f"Bearer {token}"}
    httpx.post(f"{url}/api/v1/clusters", json={"name": "demo"}, headers=admin)
    httpx.post(f"{url}/api/v1/users", json={"name": "viewer", "team": "default"}, headers=admin).raise_for_status()
    viewer = httpx.post(f"{url}/api/v1/tokens", json={"user": "viewer"}, headers=admin).json()["token"]
    yield url, token, viewer
    server.should_exit = True
    thread.join(timeout=10)


# What a team member who owns nothing may still change: their own tokens and session, and clusters of their own.
# Every other change, derived from the app's own routes below, is refused to them; so are the admin-only reads.
SELF_SERVICE = {("POST", "/api/v1/tokens"), ("POST", "/login"), ("POST", "/logout"), ("POST", "/api/v1/clusters")}
ADMIN_READS = {("GET", "/metrics"), ("GET", "/api/v1/users")}


def _operate_routes(schema_paths: dict[str, dict[str, object]]) -> set[tuple[str, str]]:
    """Every (method, path template) of the app that changes something, but self-service, plus admin-only reads."""
    changes = {(m.upper(), path) for path, ops in schema_paths.items() for m in ops if m.upper() != "GET"}
    return (changes - SELF_SERVICE) | ADMIN_READS


def test_no_request_gets_a_server_error_and_no_viewer_operates(live: tuple[str, str, str]) -> None:
    url, token, viewer = live
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) > 15
    protected = _operate_routes(httpx.get(f"{url}/openapi.json").json()["paths"])
    assert len(protected) > 25 and ("POST", "/api/v1/jobs/{job_id}/stop") in protected
    statuses: list[int] = []

    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def check(case: schemathesis.Case) -> None:
            for who, headers in (
                ("admin", {"Authorization": f"Bearer {token}"}),
                ("viewer", {"Authorization": f"Bearer {viewer}"}),
                ("nobody", {}),
            ):
                response = case.call(base_url=url, headers=headers)
                statuses.append(response.status_code)
                where = (who, case.method, case.formatted_path, response.status_code, response.text[:300])
                assert response.status_code < 500, where
                if who == "nobody" and case.formatted_path not in PUBLIC_PATHS:
                    assert response.status_code in (401, 404, 405, 422), where
                if who == "viewer" and (case.method, case.operation.path) in protected:
                    assert not 200 <= response.status_code < 300, where

        check()
    assert len(statuses) > 200 and {200, 401, 422} <= set(statuses)
