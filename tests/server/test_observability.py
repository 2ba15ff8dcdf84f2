"""Monitoring routes in-process (fake backend): service discovery needs a token and shows only what the caller
may view, raypod's /metrics is for admins, charts say clearly when monitoring is off."""

from __future__ import annotations

import time

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import make_user, wait_ready


def test_discovery_needs_a_token(client: TestClient) -> None:
    for path in ("/api/v1/monitoring/sd", "/api/v1/monitoring/sd?job=raypod", "/metrics"):
        response = client.get(path)
        assert response.status_code == 401, path
        assert response.json()["code"] == "unauthenticated"


def test_discovery_lists_alive_nodes_of_visible_clusters(client: TestClient, admin: dict[str, str]) -> None:
    bob = make_user(client, admin, "bob", "research")
    client.post(
        "/api/v1/clusters", json={"name": "a", "worker_groups": [{"name": "cpu", "replicas": 1}]}, headers=admin
    )
    client.post("/api/v1/clusters", json={"name": "b", "namespace": "research"}, headers=bob).raise_for_status()
    wait_ready(client, admin, "default", "a")
    wait_ready(client, admin, "research", "b")
    groups = client.get("/api/v1/monitoring/sd", headers=admin).json()
    assert sorted((g["labels"]["ray_io_cluster"], g["labels"]["node"]) for g in groups) == [
        ("a", "cpu-0"),
        ("a", "head"),
        ("b", "head"),
    ]
    assert all(len(g["targets"]) == 1 and g["targets"][0].endswith(".fake:8080") for g in groups)
    assert [g["labels"]["ray_io_cluster"] for g in client.get("/api/v1/monitoring/sd", headers=bob).json()] == ["b"]
    assert client.get("/api/v1/monitoring/sd?job=raypod", headers=admin).json() == [
        {"targets": ["testserver"], "labels": {"service": "raypod"}}
    ]
    assert client.get("/api/v1/monitoring/sd?job=nope", headers=admin).status_code == 422

    client.delete("/api/v1/namespaces/default/clusters/a", headers=admin).raise_for_status()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        names = {g["labels"]["ray_io_cluster"] for g in client.get("/api/v1/monitoring/sd", headers=admin).json()}
        if names == {"b"}:
            break
        time.sleep(0.05)
    assert names == {"b"}


def test_raypod_metrics_are_for_admins(client: TestClient, admin: dict[str, str]) -> None:
    bob = make_user(client, admin, "bob", "research")
    assert client.get("/metrics", headers=bob).status_code == 403
    client.post("/api/v1/clusters", json={"name": "a"}, headers=admin).raise_for_status()
    wait_ready(client, admin, "default", "a")
    response = client.get("/metrics", headers=admin)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    families = {family.name for family in text_string_to_metric_families(response.text)}
    assert {"raypod_clusters", "raypod_nodes", "raypod_reconcile_duration_seconds", "raypod_node_events"} <= families


def test_charts_say_when_monitoring_is_off(client: TestClient, admin: dict[str, str]) -> None:
    client.post("/api/v1/clusters", json={"name": "a"}, headers=admin).raise_for_status()
    response = client.get("/api/v1/namespaces/default/clusters/a/charts", headers=admin)
    assert response.status_code == 409
    assert "raypod monitoring up" in response.json()["message"]
    assert client.get("/api/v1/namespaces/default/clusters/nope/charts", headers=admin).status_code == 404
