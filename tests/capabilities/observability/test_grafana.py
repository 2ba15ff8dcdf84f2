"""grafana-sync against Grafana's HTTP API. No Grafana can run on these machines (it is in no registry here), so
this fake answers as Grafana's folder, datasource and dashboard endpoints do (auth, 404 for missing, overwrite)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from raypod import errors
from raypod.capabilities.observability import dashboards, grafana

TOKEN = "glsa_test"


class FakeGrafana:
    def __init__(self) -> None:
        self.folders: dict[str, str] = {}
        self.datasources: dict[str, dict[str, Any]] = {}
        self.dashboards: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls.append((request.method, request.url.path))
        if request.headers.get("authorization") != f"Bearer {TOKEN}":
            return httpx.Response(401, json={"message": "invalid API key"})
        path, method = request.url.path, request.method
        body = json.loads(request.content) if request.content else {}
        if method == "GET" and path.startswith("/api/folders/"):
            uid = path.rsplit("/", 1)[1]
            return httpx.Response(200, json={"uid": uid}) if uid in self.folders else httpx.Response(404, json={})
        if method == "POST" and path == "/api/folders":
            self.folders[body["uid"]] = body["title"]
            return httpx.Response(200, json=body)
        if method == "GET" and path.startswith("/api/datasources/uid/"):
            uid = path.rsplit("/", 1)[1]
            return httpx.Response(200, json={}) if uid in self.datasources else httpx.Response(404, json={})
        if method == "POST" and path == "/api/datasources":
            self.datasources[body["uid"]] = body
            return httpx.Response(200, json={"id": 1})
        if method == "POST" and path == "/api/dashboards/db":
            dashboard = body["dashboard"]
            if dashboard["uid"] in self.dashboards and not body["overwrite"]:
                return httpx.Response(412, json={"message": "version-mismatch"})
            if body["folderUid"] not in self.folders:
                return httpx.Response(400, json={"message": "folder not found"})
            self.dashboards[dashboard["uid"]] = dashboard
            return httpx.Response(200, json={"uid": dashboard["uid"], "url": f"/d/{dashboard['uid']}/x"})
        return httpx.Response(404, json={"message": "not found"})


@pytest.fixture(scope="module")
def everything() -> dict[str, dict[str, Any]]:
    return dashboards.all_dashboards()


def test_sync_creates_the_folder_datasource_and_every_dashboard_and_is_idempotent(
    everything: dict[str, dict[str, Any]],
) -> None:
    fake = FakeGrafana()
    with httpx.Client(transport=httpx.MockTransport(fake)) as http:
        synced = grafana.sync("http://grafana", TOKEN, everything, "http://127.0.0.1:9090", http=http)
        again = grafana.sync("http://grafana", TOKEN, everything, "http://127.0.0.1:9090", http=http)
    assert fake.folders == {"raypod-ray": "Ray"}
    assert fake.datasources["raypod-prometheus"]["url"] == "http://127.0.0.1:9090"
    assert set(fake.dashboards) == {d["uid"] for d in everything.values()}
    assert [s.title for s in synced] == [d["title"] for d in everything.values()] == [s.title for s in again]
    assert synced[0].url.startswith("http://grafana/d/")
    assert fake.calls.count(("POST", "/api/folders")) == 1


def test_a_refused_token_is_a_clear_error(everything: dict[str, dict[str, Any]]) -> None:
    with httpx.Client(transport=httpx.MockTransport(FakeGrafana())) as http, pytest.raises(errors.Unauthenticated):
        grafana.sync("http://grafana", "wrong", everything, http=http)


def test_no_grafana_at_the_url_is_a_clear_error(everything: dict[str, dict[str, Any]]) -> None:
    with pytest.raises(errors.ServerUnreachable, match="no Grafana answers"):
        grafana.sync("http://127.0.0.1:1", TOKEN, everything)
