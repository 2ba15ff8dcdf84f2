"""The audit log in-process (fake backend): every change anyone asks for is recorded with who, from where and how
it ended; reads are not; no secret is in it; only admins read it; and an entry changed or removed in the database
afterwards (the attack: someone with the database covering their tracks) is found by ``verify``."""

from __future__ import annotations

import json
from pathlib import Path

import sqlalchemy as sa
from fastapi.testclient import TestClient

from tests.server.conftest import make_user, wait_ready

DEMO = {"name": "demo", "worker_groups": [{"name": "cpu", "replicas": 1}]}


def entries(client: TestClient, admin: dict[str, str], **params: str) -> list[dict[str, object]]:
    found = client.get("/api/v1/audit", params=params, headers=admin)
    assert found.status_code == 200, found.text
    return list(found.json())


def test_changes_are_recorded_with_who_what_and_the_result_and_reads_are_not(
    client: TestClient, admin: dict[str, str]
) -> None:
    alice = make_user(client, admin, "alice", "ml")
    client.post("/api/v1/clusters", json={**DEMO, "namespace": "ml"}, headers=alice).raise_for_status()
    wait_ready(client, alice, "ml", "demo")
    client.get("/api/v1/namespaces/ml/clusters/demo", headers=alice).raise_for_status()
    assert client.delete("/api/v1/namespaces/default/clusters/nope", headers=alice).status_code == 403
    mine = entries(client, admin, user="alice")
    assert [(e["source"], e["action"], e["target"], e["result"]) for e in mine] == [
        ("api", "POST /api/v1/clusters", "ml/demo", 202),
        ("api", "DELETE /api/v1/namespaces/default/clusters/nope", "default/nope", 403),
    ]
    assert all(e["via"] == "token" and e["token_id"] and e["client"] for e in mine)
    admin_actions = [e["action"] for e in entries(client, admin, user="admin")]
    assert "POST /api/v1/users" in admin_actions and "POST /api/v1/tokens" in admin_actions
    assert [e["action"] for e in entries(client, admin, cluster="default/nope")] == [
        "DELETE /api/v1/namespaces/default/clusters/nope"
    ]


def test_sign_ins_are_recorded_and_no_secret_is_in_the_log(
    client: TestClient, admin: dict[str, str], tmp_path: Path
) -> None:
    token = admin["Authorization"].split()[1]
    client.post("/login", data={"token": "rpt_wrong"})
    client.post("/login", data={"token": token}).raise_for_status()
    created = client.post("/api/v1/tokens", json={"name": "ci"}, headers=admin).json()
    logins = [(e["actor"], e["result"]) for e in entries(client, admin) if e["source"] == "login"]
    assert logins == [("", 401), ("admin", 200)]
    exported = client.get("/api/v1/audit/export", headers=admin)
    assert exported.status_code == 200 and exported.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in exported.text.splitlines()]
    assert [e["seq"] for e in lines] == list(range(1, len(lines) + 1))
    for secret in (token, created["token"], "rpt_wrong"):
        assert secret not in exported.text
    assert oct((tmp_path / "audit.head").stat().st_mode & 0o777) == "0o600"


def test_only_installation_admins_read_the_log(client: TestClient, admin: dict[str, str]) -> None:
    alice = make_user(client, admin, "alice", "ml")
    for path in ("/api/v1/audit", "/api/v1/audit/verify", "/api/v1/audit/export"):
        assert client.get(path, headers=alice).status_code == 403, path
        assert client.get(path).status_code == 401, path


def test_an_entry_changed_or_removed_afterwards_is_detected(
    client: TestClient, admin: dict[str, str], tmp_path: Path
) -> None:
    for name in ("a", "b", "c", "d"):
        client.post("/api/v1/teams", json={"name": name}, headers=admin).raise_for_status()
    assert client.get("/api/v1/audit/verify", headers=admin).json()["intact"] is True
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'raypod.db'}")
    with engine.begin() as connection:
        seq = connection.execute(sa.text("SELECT seq FROM audit_log WHERE action LIKE 'POST /api/v1/teams' LIMIT 1"))
        second = int(seq.scalar_one()) + 1
        connection.execute(sa.text("UPDATE audit_log SET actor = 'someone-else' WHERE seq = :s"), {"s": second})
    broken = client.get("/api/v1/audit/verify", headers=admin).json()
    assert broken["intact"] is False and broken["first_bad"] == second and "changed" in broken["message"]

    with engine.begin() as connection:  # removing it instead leaves a gap
        connection.execute(sa.text("DELETE FROM audit_log WHERE seq = :s"), {"s": second})
    broken = client.get("/api/v1/audit/verify", headers=admin).json()
    assert broken["intact"] is False and "missing" in broken["message"]


def test_removing_the_newest_entries_is_detected(client: TestClient, admin: dict[str, str], tmp_path: Path) -> None:
    for name in ("a", "b"):
        client.post("/api/v1/teams", json={"name": name}, headers=admin).raise_for_status()
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'raypod.db'}")
    with engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM audit_log WHERE seq = (SELECT MAX(seq) FROM audit_log)"))
    broken = client.get("/api/v1/audit/verify", headers=admin).json()
    assert broken["intact"] is False and "removed" in broken["message"]


def test_the_console_page_is_for_admins_and_shows_the_entries_and_the_chain(
    client: TestClient, admin: dict[str, str]
) -> None:
    alice = make_user(client, admin, "alice", "ml")
    token = admin["Authorization"].split()[1]
    client.post("/login", data={"token": alice["Authorization"].split()[1]}).raise_for_status()
    assert client.get("/audit").status_code == 403
    assert 'href="/audit"' not in client.get("/").text
    client.post("/login", data={"token": token}).raise_for_status()
    page = client.get("/audit", params={"user": "alice"})
    assert page.status_code == 200 and "Chain intact" in page.text
    assert "POST /login" in page.text and "POST /api/v1/users" not in page.text
    assert 'href="/audit"' in client.get("/").text


def test_calls_of_a_clusters_models_through_the_gateway_are_not_changes() -> None:
    from raypod.server import audit, origins

    assert audit.is_inference({"path": "/clusters/ml/demo/serve/chat/v1/completions"})
    assert not audit.is_inference({"path": "/clusters/ml/demo/api/jobs/"})
    own = origins.Target("cluster", "ml", "demo")
    assert audit.is_inference({"path": "/serve/chat/v1/completions", "raypod.target": own})
    assert not audit.is_inference({"path": "/api/jobs/", "raypod.target": own})
