"""Authentication and authorization of every route, in-process (fake backend; no Ray needed)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.routing import APIWebSocketRoute, iter_route_contexts
from fastapi.testclient import TestClient
from starlette.routing import Mount
from starlette.websockets import WebSocketDisconnect

from raypod import config, state
from raypod.backends.fake import FakeBackend
from raypod.controlplane import identity
from raypod.server.app import create_app

PUBLIC = {
    ("GET", "/healthz"),
    ("GET", "/login"),
    ("POST", "/login"),
    ("GET", "/static"),  # the console's own CSS and JS, which the login page needs
    ("GET", "/openapi.json"),
    ("GET", "/docs"),
    ("GET", "/docs/oauth2-redirect"),
    ("GET", "/redoc"),
    # Single sign-on (docs/sso.md): each is authenticated by what the provider issued, never a raypod credential.
    ("GET", "/login/sso"),
    ("GET", "/login/sso/callback"),
    ("POST", "/login/sso/backchannel-logout"),
    ("GET", "/api/v1/sso"),
    ("POST", "/api/v1/sso/device"),
    ("POST", "/api/v1/sso/device/token"),
    ("POST", "/api/v1/sso/refresh"),
}
# Console pages send a browser without a session to the login page instead of answering 401.
CONSOLE_PAGES = {
    "/",
    "/new",
    "/events",
    "/audit",
    "/quotas",
    "/namespaces/{namespace}/clusters/{name}",
    "/namespaces/{namespace}/clusters/{name}/jobs/new",
    "/jobs/{job_id}",
}
PARAMS = {
    "namespace": "default",
    "name": "demo",
    "path": "api/version",
    "team": "default",
    "scope": "teams",
    "owner": "default",
    "token_id": "abc",
    "job_id": "rj-0123456789",
    "node": "head",
    "action": "replace",
    "model_id": "llama-tiny",
    "deployment": "llama-tiny",
}


@pytest.fixture
def app_and_admin(tmp_path: Path) -> Iterator[tuple[TestClient, str]]:
    app = create_app(config.Settings(home=tmp_path, reconcile_interval_s=0.05, tls=False), backend=FakeBackend())
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, json.loads((tmp_path / "credentials").read_text())["token"]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def fill(path: str) -> str:
    return re.sub(r"\{(\w+)(:path)?\}", lambda m: PARAMS[m.group(1)], path)


def test_every_route_answers_401_without_credentials_except_the_public_ones(
    app_and_admin: tuple[TestClient, str],
) -> None:
    client, _ = app_and_admin
    checked, public, pages = 0, set(), set()
    # FastAPI keeps included routers lazily: iter_route_contexts lists every route with its full path.
    for route in iter_route_contexts(client.app.routes):  # type: ignore[attr-defined]
        assert route.path is not None
        if isinstance(route.original_route, APIWebSocketRoute):
            with pytest.raises(WebSocketDisconnect) as closed, client.websocket_connect(fill(route.path)) as ws:
                ws.receive_text()
            assert closed.value.code == 4401
            checked += 1
            continue
        if isinstance(route.original_route, Mount):
            assert client.get(f"{route.path}/console.js").status_code == 200
            public.add(("GET", route.path))
            continue
        for method in sorted((route.methods or set()) - {"HEAD"}):
            response = client.request(method, fill(route.path), follow_redirects=False)
            if method == "GET" and route.path in CONSOLE_PAGES:
                pages.add(route.path)
                assert response.status_code == 303, route.path
                assert response.headers["location"].startswith("/login?next=/"), route.path
                assert client.get(fill(route.path) + "?regions=1").status_code == 401, route.path
                continue
            if (method, route.path) in PUBLIC:
                public.add((method, route.path))
                assert response.status_code != 401, (method, route.path)
                continue
            checked += 1
            assert response.status_code == 401, (method, route.path, response.status_code, response.text[:200])
            assert response.json()["code"] == "unauthenticated"
    assert public == PUBLIC
    assert pages == CONSOLE_PAGES
    assert checked > 30


def test_wrong_scheme_and_garbage_tokens_are_401(app_and_admin: tuple[TestClient, str]) -> None:
    client, _ = app_and_admin
    for header in ("Basic abc", "Bearer", "Bearer rpt_nope", "Bearer rpt_000000000000_wrong", "token x"):
        response = client.get("/api/v1/clusters", headers={"Authorization": header})
        assert response.status_code == 401, header


def test_expired_and_revoked_tokens_get_401(app_and_admin: tuple[TestClient, str]) -> None:
    client, admin = app_and_admin
    short = client.post("/api/v1/tokens", json={"name": "short", "ttl_seconds": 1}, headers=bearer(admin)).json()
    assert client.get("/api/v1/whoami", headers=bearer(short["token"])).status_code == 200
    time.sleep(1.2)
    expired = client.get("/api/v1/whoami", headers=bearer(short["token"]))
    assert expired.status_code == 401 and "expired" in expired.json()["message"]

    other = client.post("/api/v1/tokens", json={"name": "other"}, headers=bearer(admin)).json()
    assert client.get("/api/v1/whoami", headers=bearer(other["token"])).status_code == 200
    assert client.delete(f"/api/v1/tokens/{other['id']}", headers=bearer(admin)).status_code == 200
    revoked = client.get("/api/v1/whoami", headers=bearer(other["token"]))
    assert revoked.status_code == 401 and "revoked" in revoked.json()["message"]


def test_token_secrets_are_stored_hashed(app_and_admin: tuple[TestClient, str], tmp_path: Path) -> None:
    client, admin = app_and_admin
    secret = admin.split("_", 2)[2]
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'raypod.db'}")
    with engine.connect() as connection:
        dump = "\n".join(str(row) for row in connection.execute(sa.text("SELECT * FROM tokens")))
    engine.dispose()
    assert secret not in dump and admin not in dump
    assert (tmp_path / "credentials").stat().st_mode & 0o777 == 0o600
    listed = client.get("/api/v1/tokens", headers=bearer(admin)).json()
    assert len(listed) >= 1 and all("id" in entry for entry in listed)
    assert all("token" not in entry and "secret_hash" not in entry for entry in listed)


def test_viewers_read_owners_and_team_admins_operate_outsiders_get_403(
    app_and_admin: tuple[TestClient, str],
) -> None:
    client, admin = app_and_admin

    def token_for(user: str, team: str | None, role: str = "member") -> str:
        client.post("/api/v1/users", json={"name": user, "team": team, "role": role}, headers=bearer(admin))
        return str(client.post("/api/v1/tokens", json={"user": user}, headers=bearer(admin)).json()["token"])

    client.post("/api/v1/teams", json={"name": "ml"}, headers=bearer(admin))
    client.post("/api/v1/namespaces", json={"name": "ml", "team": "ml"}, headers=bearer(admin))
    alice, bob, carol, dave = (
        token_for("alice", "ml"),
        token_for("bob", "ml"),
        token_for("carol", "ml", "admin"),
        token_for("dave", "default"),
    )
    created = client.post("/api/v1/clusters", json={"name": "train", "namespace": "ml"}, headers=bearer(alice))
    assert created.status_code == 202 and created.json()["spec"]["owner"] == "alice"
    path = "/api/v1/namespaces/ml/clusters/train"

    assert client.get(path, headers=bearer(bob)).status_code == 200
    denied = client.delete(path, headers=bearer(bob))
    assert denied.status_code == 403
    assert "only the cluster owner (alice) or admins of team 'ml'" in denied.json()["message"]
    gateway = client.post("/clusters/ml/train/api/jobs/", json={"entrypoint": "echo"}, headers=bearer(bob))
    assert gateway.status_code == 403

    outsider = client.get(path, headers=bearer(dave))
    assert outsider.status_code == 403 and "not a member of its team" in outsider.json()["message"]
    assert "team 'ml'" not in outsider.json()["message"], "an outsider is not told the namespace's team (issue 28)"
    # Through the gateway an outsider cannot tell an existing cluster from a missing one (issue 12).
    hidden = client.get("/clusters/ml/train/api/version", headers=bearer(dave))
    missing = client.get("/clusters/ml/nope/api/version", headers=bearer(dave))
    assert hidden.status_code == missing.status_code == 404
    assert hidden.json()["message"].replace("train", "X") == missing.json()["message"].replace("nope", "X")
    assert [c["spec"]["name"] for c in client.get("/api/v1/clusters", headers=bearer(dave)).json()] == []
    assert (
        client.post("/api/v1/clusters", json={"name": "x", "namespace": "ml"}, headers=bearer(dave)).status_code == 403
    )
    assert client.post("/api/v1/users", json={"name": "eve"}, headers=bearer(alice)).status_code == 403

    scaled = client.post(f"{path}/scale", json={"group": "g", "replicas": 1}, headers=bearer(carol))
    assert scaled.status_code == 404  # allowed past authorization: the group does not exist
    # Node verbs are operator verbs: the owner and team admins, not viewers or outsiders.
    assert client.post(f"{path}/nodes/head/replace", headers=bearer(bob)).status_code == 403
    assert client.post(f"{path}/nodes/head/cordon", headers=bearer(dave)).status_code == 403
    assert client.post(f"{path}/nodes/head/cordon", headers=bearer(carol)).status_code == 202
    assert client.delete(path, headers=bearer(alice)).status_code == 202


def test_browser_session_needs_csrf_for_changes(app_and_admin: tuple[TestClient, str]) -> None:
    client, admin = app_and_admin
    assert client.post("/login", data={"token": "rpt_bad_bad"}).status_code == 401
    login = client.post("/login", data={"token": admin})
    assert login.status_code == 200
    cookie = login.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie
    csrf = login.json()["csrf_token"]
    assert client.get("/api/v1/whoami").json()["name"] == "admin"
    body = {"name": "web"}
    refused = client.post("/api/v1/clusters", json=body)
    assert refused.status_code == 403 and "csrf" in refused.json()["message"].lower()
    assert client.post("/api/v1/clusters", json=body, headers={"X-CSRF-Token": "wrong"}).status_code == 403
    assert client.post("/api/v1/clusters", json=body, headers={"X-CSRF-Token": csrf}).status_code == 202
    # A session's websocket (the console's log view) must come from the console's own origin.
    other_site = {"Origin": "https://evil.example"}
    with (
        pytest.raises(WebSocketDisconnect) as closed,
        client.websocket_connect("/clusters/default/web/api/jobs/x/logs/tail", headers=other_site) as ws,
    ):
        ws.receive_text()
    assert closed.value.code == 4403 and "cross-origin" in closed.value.reason
    same_site = {"Origin": "http://testserver"}
    with (
        pytest.raises(WebSocketDisconnect) as closed,
        client.websocket_connect("/clusters/default/web/api/jobs/x/logs/tail", headers=same_site) as ws,
    ):
        ws.receive_text()
    assert "cross-origin" not in closed.value.reason  # past the origin check (the fake cluster has no dashboard)
    assert client.post("/logout", headers={"X-CSRF-Token": csrf}).status_code == 200
    client.cookies.clear()
    assert client.get("/api/v1/whoami").status_code == 401


@pytest.mark.parametrize(
    "name", ["..", "...", "..%2F..%2Fetc", "a%2Fb", "A", "x" * 80, "demo;rm", "%00", "-a", "d%C3%A9mo"]
)
def test_odd_and_traversal_shaped_names_are_rejected_cleanly(app_and_admin: tuple[TestClient, str], name: str) -> None:
    client, admin = app_and_admin
    for path in (
        f"/api/v1/namespaces/default/clusters/{name}",
        f"/api/v1/namespaces/{name}/clusters/demo",
        f"/clusters/default/{name}/api/version",
        f"/clusters/{name}/demo/api/version",
    ):
        response = client.get(path, headers=bearer(admin))
        assert response.status_code in (403, 404, 422), (path, response.status_code)
    created = client.post("/api/v1/clusters", json={"name": name.replace("%2F", "/")}, headers=bearer(admin))
    assert created.status_code == 422
    assert client.get("/api/v1/clusters", headers=bearer(admin)).json() == []


def test_identity_names_are_validated(app_and_admin: tuple[TestClient, str]) -> None:
    client, admin = app_and_admin
    assert client.post("/api/v1/users", json={"name": "../root"}, headers=bearer(admin)).status_code == 422
    assert client.post("/api/v1/teams", json={"name": "Team"}, headers=bearer(admin)).status_code == 422
    missing = client.post("/api/v1/namespaces", json={"name": "ns", "team": "nope"}, headers=bearer(admin))
    assert missing.status_code == 404 and "team 'nope' not found" in missing.json()["message"]
    again = client.post("/api/v1/teams", json={"name": "default"}, headers=bearer(admin))
    assert again.status_code == 409


def test_authorize_is_a_pure_table() -> None:
    alice = identity.Principal("alice", teams={"ml": state.Role.MEMBER})
    identity.authorize(alice, identity.Verb.VIEW, "ml", "ml")
    identity.authorize(alice, identity.Verb.OPERATE, "ml", "ml", owner="alice")
    with pytest.raises(Exception, match="only the cluster owner"):
        identity.authorize(alice, identity.Verb.OPERATE, "ml", "ml", owner="bob")
    with pytest.raises(Exception, match="does not exist"):
        identity.authorize(alice, identity.Verb.CREATE, "new", None)
    identity.authorize(identity.Principal("root", is_admin=True), identity.Verb.OPERATE, "x", None)
