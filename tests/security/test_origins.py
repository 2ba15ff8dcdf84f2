"""Proxied pages never run on the console's origin (issue 28, finding 3), in-process: a cluster's dashboard (an
echoing stand-in that can also set cookies and serve a hostile page) reached by a browser session, by a token,
and through the cluster's own origin. The same attack in real Chromium is in tests/e2e/test_console.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from fastapi.testclient import TestClient

from raypod.server import origins
from tests.security.conftest import App, EchoBackend, EchoDashboard, make_app
from tests.security.test_attacks import wait_ready

ORIGIN = "train--ml.localhost"
SAME_ORIGIN = {"Sec-Fetch-Site": "same-origin"}


@pytest.fixture
def echo(tmp_path: Path) -> Iterator[tuple[App, EchoDashboard]]:
    dashboard = EchoDashboard()
    try:
        for app in make_app(tmp_path, EchoBackend(dashboard)):
            app.cluster("train", owner="alice")
            wait_ready(app, "ml", "train")
            yield app, dashboard
    finally:
        dashboard.close()


def enter(app: App, user: str = "alice", path: str = "/clusters/ml/train/") -> TestClient:
    """A browser: logs in to the console, follows the dashboard link to the cluster's origin; the returned client
    now talks to that origin with its cookie (and has the console session's CSRF token in ``app.csrf``)."""
    app.csrf = app.login(app.tokens[user])  # type: ignore[attr-defined]
    redirect = app.http.get(path, follow_redirects=False)
    assert redirect.status_code == 303, redirect.text
    location = urlsplit(redirect.headers["location"])
    assert location.hostname == ORIGIN and location.path == origins.ENTER_PATH
    entered = app.http.get(f"{location.path}?{location.query}", headers={"Host": ORIGIN}, follow_redirects=False)
    assert entered.status_code == 303, entered.text
    assert entered.headers["location"] == parse_qs(location.query)["next"][0]
    return app.http


def test_a_browser_session_is_never_served_proxied_pages_on_the_consoles_origin(
    echo: tuple[App, EchoDashboard],
) -> None:
    app, dashboard = echo
    app.login(app.admin)
    for path in ("/clusters/ml/train/", "/clusters/ml/train/page", "/clusters/ml/train/serve/app/page"):
        answer = app.http.get(path, follow_redirects=False)
        assert answer.status_code == 303 and urlsplit(answer.headers["location"]).hostname == ORIGIN, path
    posted = app.http.post("/clusters/ml/train/api/jobs/", json={}, headers=SAME_ORIGIN)
    assert posted.status_code == 403
    assert dashboard.received == []


def test_a_tokens_proxied_answer_on_the_consoles_origin_is_sandboxed_and_sets_no_cookie(
    echo: tuple[App, EchoDashboard],
) -> None:
    app, _ = echo
    answer = app.http.get("/clusters/ml/train/cookies", headers=app.as_("alice"))
    assert answer.status_code == 200
    assert answer.headers["content-security-policy"] == "sandbox"
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert "set-cookie" not in answer.headers


def test_an_upstream_cannot_set_raypods_cookies_or_cookies_for_sibling_origins(
    echo: tuple[App, EchoDashboard],
) -> None:
    app, _ = echo
    browser = enter(app)
    answer = browser.get("/cookies", headers={"Host": ORIGIN})
    assert answer.status_code == 200
    cookies = answer.headers.get_list("set-cookie")
    assert cookies == ["_xsrf=kept; Path=/"], cookies
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert "frame-ancestors 'self'" in answer.headers["content-security-policy"]


def test_an_origins_cookie_opens_only_its_own_cluster_and_a_ticket_is_used_once(
    echo: tuple[App, EchoDashboard],
) -> None:
    app, dashboard = echo
    body = {"name": "other", "namespace": "ml", "worker_groups": [{"name": "cpu", "replicas": 0}]}
    assert app.http.post("/api/v1/clusters", json=body, headers=app.as_("alice")).status_code == 202
    wait_ready(app, "ml", "other")
    app.login(app.tokens["alice"])
    redirect = urlsplit(app.http.get("/clusters/ml/train/", follow_redirects=False).headers["location"])
    enter_path = f"{redirect.path}?{redirect.query}"
    wrong_host = app.http.get(enter_path, headers={"Host": "other--ml.localhost"}, follow_redirects=False)
    assert wrong_host.status_code == 403
    assert app.http.get(enter_path, headers={"Host": ORIGIN}, follow_redirects=False).status_code == 403, "used"
    browser = enter(app)
    assert browser.get("/api/version", headers={"Host": ORIGIN}).status_code == 200
    other = browser.get("/api/version", headers={"Host": "other--ml.localhost"}, follow_redirects=False)
    assert other.status_code == 303 and urlsplit(other.headers["location"]).path == "/clusters/ml/other/api/version"
    assert [r["path"] for r in dashboard.received] == ["/api/version"]


def test_an_origin_takes_no_change_from_a_sibling_origin_and_ends_with_the_console_session(
    echo: tuple[App, EchoDashboard],
) -> None:
    app, dashboard = echo
    browser = enter(app)
    sibling = {"Host": ORIGIN, "Sec-Fetch-Site": "same-site", "Origin": "http://evil--ml.localhost"}
    assert browser.post("/api/jobs/", json={"entrypoint": "x"}, headers=sibling).status_code == 403
    own = {"Host": ORIGIN, "Sec-Fetch-Site": "same-origin", "Origin": f"http://{ORIGIN}"}
    assert browser.post("/api/jobs/", json={"entrypoint": "x"}, headers=own).status_code == 200
    assert [r["path"] for r in dashboard.received] == ["/api/jobs/"]
    logout = app.http.post("/logout", headers={"x-csrf-token": app.csrf, **SAME_ORIGIN})  # type: ignore[attr-defined]
    assert logout.status_code == 200
    after = browser.get("/api/version", headers={"Host": ORIGIN}, follow_redirects=False)
    assert after.status_code in (303, 401)
    assert len(dashboard.received) == 1


def test_outsiders_learn_nothing_from_an_origin_and_a_viewer_cannot_operate_there(
    echo: tuple[App, EchoDashboard],
) -> None:
    app, dashboard = echo
    app.login(app.tokens["dave"])
    hidden = app.http.get("/clusters/ml/train/", follow_redirects=False)
    assert hidden.status_code == 404
    direct = app.http.get("/api/version", headers={"Host": ORIGIN, **app.as_("dave")})
    assert direct.status_code == 404
    bob = enter(app, "bob")
    own = {"Host": ORIGIN, "Sec-Fetch-Site": "same-origin", "Origin": f"http://{ORIGIN}"}
    assert bob.post("/api/jobs/", json={"entrypoint": "x"}, headers=own).status_code == 403
    assert dashboard.received == []


def test_the_session_cookie_is_host_prefixed_over_tls(tmp_path: Path) -> None:
    for app in make_app(tmp_path):
        app.http.base_url = "https://testserver"  # type: ignore[assignment]
        answer = app.http.post("/login", data={"token": app.tokens["alice"]}, headers=SAME_ORIGIN)
        assert answer.status_code == 200
        cookie = answer.headers["set-cookie"]
        assert cookie.startswith("__Host-raypod_session=") and "Secure" in cookie and "Domain" not in cookie


@pytest.mark.parametrize(
    "query", ["/%09/evil.example/x", "//evil.example", "/%5Cevil.example", "https://evil.example", "/%0D%0A/evil"]
)
def test_login_next_is_a_same_origin_path_as_a_browser_reads_it(app: App, query: str) -> None:
    page = app.http.get(f"/login?next={query}")
    assert page.status_code == 200
    assert "evil" not in page.text.split("<form", 1)[1].split("</form>", 1)[0]
