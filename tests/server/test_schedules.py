"""Scheduled jobs' routes in-process: create, list, get, suspend, resume, delete; bad input and other teams."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.server.conftest import make_user, wait_ready

SCHEDULE = {"name": "nightly", "cluster": "demo", "cron": "0 3 * * *", "job": {"entrypoint": "python x.py"}}


def test_a_schedule_is_created_listed_suspended_resumed_and_deleted(client: TestClient, admin: dict[str, str]) -> None:
    client.post("/api/v1/clusters", json={"name": "demo"}, headers=admin).raise_for_status()
    wait_ready(client, admin, "default", "demo")
    created = client.post("/api/v1/schedules", json=SCHEDULE, headers=admin)
    assert created.status_code == 201 and created.json()["next_run_at"].endswith("03:00:00Z")
    assert client.post("/api/v1/schedules", json=SCHEDULE, headers=admin).status_code == 409
    assert [s["spec"]["name"] for s in client.get("/api/v1/schedules", headers=admin).json()] == ["nightly"]
    path = "/api/v1/namespaces/default/schedules/nightly"
    suspended = client.post(f"{path}/suspend", headers=admin).json()
    assert suspended["spec"]["suspended"] is True and suspended["next_run_at"] is None
    assert client.post(f"{path}/resume", headers=admin).json()["spec"]["suspended"] is False
    assert client.delete(path, headers=admin).status_code == 204
    assert client.get(path, headers=admin).status_code == 404


def test_bad_input_is_a_clear_4xx_and_other_teams_cannot_schedule(client: TestClient, admin: dict[str, str]) -> None:
    alice = make_user(client, admin, "alice", "ml")
    client.post("/api/v1/clusters", json={"name": "demo"}, headers=admin).raise_for_status()
    bad = client.post("/api/v1/schedules", json={**SCHEDULE, "cron": "every night"}, headers=admin)
    assert bad.status_code == 422 and "cron" in bad.text
    assert client.post("/api/v1/schedules", json={**SCHEDULE, "cluster": "nope"}, headers=admin).status_code == 404
    assert client.post("/api/v1/schedules", json=SCHEDULE, headers=alice).status_code in (403, 404)
