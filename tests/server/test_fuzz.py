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
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    url, token, server, thread = _serve(tmp_path_factory.mktemp("fuzz"))
    httpx.post(f"{url}/api/v1/clusters", json={"name": "demo"}, headers={"Authorization": f"Bearer {token}"})
    yield url, token
    server.should_exit = True
    thread.join(timeout=10)


def test_no_request_gets_a_server_error(live: tuple[str, str]) -> None:
    url, token = live
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) > 15
    statuses: list[int] = []

    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def check(case: schemathesis.Case) -> None:
            for headers in ({"Authorization": f"Bearer {token}"}, {}):
                response = case.call(base_url=url, headers=headers)
                statuses.append(response.status_code)
                where = (case.method, case.formatted_path, response.status_code, response.text[:300])
                assert response.status_code < 500, where
                if not headers and case.formatted_path not in ("/healthz", "/login"):
                    assert response.status_code in (401, 404, 405, 422), where

        check()
    assert len(statuses) > 200 and {200, 401, 422} <= set(statuses)
