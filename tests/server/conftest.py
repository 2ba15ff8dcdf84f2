"""Server tests in-process: create_app with the fake backend behind FastAPI's TestClient (no sockets, no Ray)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from raypod import config
from raypod.backends.fake import FakeBackend
from raypod.server.app import create_app


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    settings = config.Settings(home=tmp_path, reconcile_interval_s=0.05, tls=False)
    with TestClient(create_app(settings, backend=FakeBackend()), raise_server_exceptions=False) as test_client:
        yield test_client


@pytest.fixture
def admin(tmp_path: Path, client: TestClient) -> dict[str, str]:
    return {"Authorization": f"Bearer {json.loads((tmp_path / 'credentials').read_text())['token']}"}


def make_user(client: TestClient, admin: dict[str, str], name: str, team: str) -> dict[str, str]:
    if client.post("/api/v1/teams", json={"name": team}, headers=admin).status_code == 201:
        client.post("/api/v1/namespaces", json={"name": team, "team": team}, headers=admin).raise_for_status()
    client.post("/api/v1/users", json={"name": name, "team": team}, headers=admin).raise_for_status()
    token = client.post("/api/v1/tokens", json={"user": name}, headers=admin).json()["token"]
    return {"Authorization": f"Bearer {token}"}


def wait_ready(client: TestClient, headers: dict[str, str], namespace: str, name: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        view = client.get(f"/api/v1/namespaces/{namespace}/clusters/{name}", headers=headers).json()
        if view["status"]["phase"] == "Ready":
            return
        time.sleep(0.05)
    raise AssertionError(f"{namespace}/{name} never became Ready")


def add_model(client: TestClient, headers: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
    """POST a catalog source (202) and wait for the serving applier's verdict: the addition, ADDED or FAILED."""
    asked = client.post("/api/v1/models", json=body, headers=headers)
    assert asked.status_code == 202, asked.text
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        addition: dict[str, Any] = client.get(f"/api/v1/models/{body['id']}/addition", headers=headers).json()
        if addition["status"] != "INSPECTING":
            return addition
        time.sleep(0.05)
    raise AssertionError(f"model {body['id']} is still being added")
