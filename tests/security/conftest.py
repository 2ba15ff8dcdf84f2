"""The attack suite: an in-process app (fake backend) for attacks on raypod itself, and the session's real server
with a real Ray cluster for attacks through the gateway."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from raypod import config, state
from raypod.backends.fake import FakeBackend
from raypod.server.app import create_app


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class App:
    """An in-process raypod with an admin, a team 'ml' (alice and bob: members, alice owns 'train'; carol: team
    admin), and an outsider (dave, team 'other')."""

    def __init__(self, client: TestClient, home: Path, backend: FakeBackend) -> None:
        self.http, self.home, self.backend = client, home, backend
        self.admin = json.loads((home / "credentials").read_text())["token"]
        admin = bearer(self.admin)
        for team in ("ml", "other"):
            client.post("/api/v1/teams", json={"name": team}, headers=admin).raise_for_status()
            client.post("/api/v1/namespaces", json={"name": team, "team": team}, headers=admin).raise_for_status()
        self.tokens: dict[str, str] = {}
        for user, team, role in (
            ("alice", "ml", "member"),
            ("bob", "ml", "member"),
            ("carol", "ml", "admin"),
            ("dave", "other", "member"),
        ):
            body = {"name": user, "team": team, "role": role}
            client.post("/api/v1/users", json=body, headers=admin).raise_for_status()
            created = client.post("/api/v1/tokens", json={"user": user}, headers=admin)
            self.tokens[user] = created.json()["token"]

    def as_(self, user: str) -> dict[str, str]:
        return bearer(self.admin if user == "admin" else self.tokens[user])

    def cluster(self, name: str = "train", owner: str = "alice") -> dict[str, Any]:
        body = {"name": name, "namespace": "ml", "worker_groups": [{"name": "cpu", "replicas": 0}]}
        created = self.http.post("/api/v1/clusters", json=body, headers=self.as_(owner))
        assert created.status_code == 202, created.text
        view: dict[str, Any] = created.json()
        return view

    def login(self, token: str) -> str:
        """A browser session for ``token``; returns its CSRF token (the cookie stays in the client)."""
        answer = self.http.post("/login", data={"token": token}, headers={"Sec-Fetch-Site": "same-origin"})
        assert answer.status_code == 200, answer.text
        csrf: str = answer.json()["csrf_token"]
        return csrf


def make_app(tmp_path: Path, backend: FakeBackend | None = None, **settings: Any) -> Iterator[App]:
    chosen = backend or FakeBackend()
    configured = config.Settings(home=tmp_path, reconcile_interval_s=0.05, tls=False, **settings)
    with TestClient(create_app(configured, backend=chosen), raise_server_exceptions=False) as client:
        yield App(client, tmp_path, chosen)


@pytest.fixture
def app(tmp_path: Path) -> Iterator[App]:
    yield from make_app(tmp_path)


UPSTREAM_COOKIES = (
    "raypod_session=fixated; Path=/",
    "__Host-raypod_session=fixated; Path=/; Secure",
    "raypod_origin=forged; Path=/",
    "wide=1; Domain=localhost; Path=/",
    "_xsrf=kept; Path=/",
)
HOSTILE_PAGE = (
    b"<html><body><script>fetch('/api/v1/users', {method: 'POST', credentials: 'include', "
    b"headers: {'content-type': 'application/json'}, body: JSON.stringify({name: 'mallory', is_admin: true})})"
    b"</script></body></html>"
)


class EchoDashboard:
    """A stand-in for a cluster's dashboard that answers with the headers and body it received, so a test can
    see exactly what the gateway forwards (a real Ray dashboard does not show that); ``/slow`` never answers
    in time. Used only where the question is what the gateway sends, not what Ray does."""

    def __init__(self) -> None:
        received: list[dict[str, Any]] = []
        self.received = received
        release = threading.Event()
        self.release = release

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                received.append(
                    {"method": self.command, "path": self.path, "headers": dict(self.headers), "body": body}
                )
                if self.path.endswith("/slow"):
                    release.wait(30)
                payload = json.dumps({"headers": {k.lower(): v for k, v in self.headers.items()}}).encode()
                page = self.path.endswith("/page")  # an HTML page whose script would act as whoever opens it
                if page:
                    payload = HOSTILE_PAGE
                self.send_response(200)
                if self.path.endswith("/cookies"):  # what a hostile page would set in the browser
                    for cookie in UPSTREAM_COOKIES:
                        self.send_header("Set-Cookie", cookie)
                self.send_header("Content-Type", "text/html" if page else "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_DELETE = do_OPTIONS = do_PATCH = _answer

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


class EchoBackend(FakeBackend):
    """The in-memory backend, with every cluster's dashboard at an EchoDashboard."""

    def __init__(self, dashboard: EchoDashboard) -> None:
        super().__init__()
        self.dashboard = dashboard

    def observe(self, cluster_id: str) -> state.ObservedCluster:
        seen = super().observe(cluster_id)
        endpoints = {**seen.endpoints, "dashboard": self.dashboard.url} if seen.nodes else {}
        return state.ObservedCluster(nodes=seen.nodes, endpoints=endpoints, gcs_reachable=seen.gcs_reachable)

    def dashboard_headers(self, cluster_id: str) -> dict[str, str]:
        return {"Authorization": "Bearer ray-token-of-" + cluster_id}
