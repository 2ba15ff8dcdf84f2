"""Single sign-on against a real OpenID Connect provider (panva's certified oidc-provider on Node.js) and a real
raypod server: a Chromium login to the console that lands with the teams the groups give, `raypod login` (the
device flow) then `ray job submit --address raypod://...` with no token pasted, a user removed from the group refused
at the next refresh, key rotation survived, the provider's back-channel logout ending a console session, and the
console's "Log out" ending the provider's session too.
The ID-token refusals (forged, expired, wrong audience...) are tests/controlplane/test_sso.py's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from raypod import state
from raypod.client import Client
from raypod.client._http import tls_verify
from tests.conftest import SHARED_CLUSTER
from tests.e2e.conftest import BROWSER_MISSING, CHROMIUM, RaypodServer, wait_until
from tests.sso.provider import MISSING, OidcProvider

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.browser,
    pytest.mark.timeout(600),
    pytest.mark.skipif(MISSING, reason="the test OIDC provider is not installed (npm ci in tests/sso)"),
    pytest.mark.skipif(BROWSER_MISSING, reason=f"{CHROMIUM} is not installed (apt-get install chromium)"),
]


HELLO = ["python", "-c", "print('hello from sso')"]


@pytest.fixture(scope="module")
def provider(raypod_server: RaypodServer) -> OidcProvider:
    """The session server's provider (tests/conftest.py starts it beside the server, with the settings it needs)."""
    assert isinstance(raypod_server.oidc, OidcProvider), "the session server runs without its OIDC provider"
    raypod_server.oidc.set_accounts({"ada": ["ml-engineers"], "olga": ["platform", "ml-leads"], "eve": ["other"]})
    return raypod_server.oidc


@pytest.fixture(scope="module")
def server(raypod_server: RaypodServer, provider: OidcProvider) -> RaypodServer:
    return raypod_server


def sign_in_at_provider(page: Any, login: str) -> None:
    """The provider's own login form (its development interactions take any password)."""
    page.locator("input[name=login]").fill(login)
    page.locator("input[name=password]").fill("any password")
    page.locator("button[type=submit]").click()


def test_a_provider_user_logs_in_to_the_console_and_lands_with_the_teams_of_their_groups(
    server: RaypodServer, provider: OidcProvider, page: Any
) -> None:
    page.goto(f"{server.url}/login?next=/quotas")
    page.get_by_test_id("sso-login").click()
    page.wait_for_url(f"{provider.issuer}/**")
    sign_in_at_provider(page, "ada")
    page.wait_for_url(f"{server.url}/quotas")
    assert "ada" in page.locator("body").inner_text()
    with server.client() as api:
        ada = api.users.list()
    found = {user.name: user for user in ada}
    assert found["ada"].teams == {"ml": "member"} and not found["ada"].is_admin  # made at first login

    # the provider ends ada's session there (back-channel logout): her console session ends at once
    cookies = page.context.cookies()
    session = next(c for c in cookies if c["name"] == "raypod_session" or c["name"].endswith("raypod_session"))
    assert page.goto(f"{server.url}/quotas").status == 200
    page.goto(f"{provider.issuer}/session/end")
    page.locator("button[autofocus], form button").first.click()  # the provider's "Yes, sign me out"
    wait_until(lambda: page.goto(f"{server.url}/quotas") and "/login" in page.url, "ada's session ended", 30)
    assert session["value"]

    # someone in none of the groups raypod maps is refused, and told why
    page.goto(f"{server.url}/login")
    page.get_by_test_id("sso-login").click()
    sign_in_at_provider(page, "eve")
    error = page.get_by_test_id("sso-error")
    error.wait_for()
    assert "none of the groups" in error.inner_text()
    with server.client() as api:
        assert "eve" not in {user.name for user in api.users.list()}

    # the provider rotates its signing key (the old one retired): the next login verifies with the new one
    provider.rotate_keys(ca_file=server.ca_file)
    page.goto(f"{server.url}/login?next=/quotas")
    page.get_by_test_id("sso-login").click()
    sign_in_at_provider(page, "ada")
    page.wait_for_url(f"{server.url}/quotas")

    # "Log out" ends her session at the provider too (RP-initiated logout), which sends the browser back to /login
    page.locator('[data-action="logout"]').click()
    page.wait_for_url(f"{provider.issuer}/**")
    page.locator("button[autofocus], form button").first.click()  # the provider's "Yes, sign me out"
    page.wait_for_url(f"{server.url}/login**")
    page.get_by_test_id("sso-login").click()
    page.locator("input[name=login]").wait_for()  # the provider asks who she is again: its session ended too


def test_raypod_login_then_ray_job_submit_with_no_token_pasted(
    server: RaypodServer, provider: OidcProvider, shared_cluster: state.ClusterView, page: Any, tmp_path: Path
) -> None:
    laptop = tmp_path / "laptop"  # olga's own machine: nothing of the server's home
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("RAYPOD_", "RAY_"))},
        "RAYPOD_HOME": str(laptop),
        "RAYPOD_SERVER": server.url,
        "RAYPOD_CA_FILE": server.ca_file,
    }
    bin_dir = Path(sys.executable).parent
    login = subprocess.Popen(
        [str(bin_dir / "raypod"), "login"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert login.stdout is not None
    lines: list[str] = []
    url_line = threading.Event()

    def read() -> None:
        assert login.stdout is not None
        for line in login.stdout:
            lines.append(line)
            if line.startswith("Open "):
                url_line.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert url_line.wait(60), "".join(lines)
    url = next(line for line in lines if line.startswith("Open ")).split()[1]
    page.goto(url)
    page.locator("button[type=submit]").first.click()  # confirm the code shown by the CLI
    sign_in_at_provider(page, "olga")
    page.get_by_text("Sign-in Success").or_(page.get_by_text("success", exact=False)).first.wait_for()
    assert login.wait(60) == 0, "".join(lines)
    reader.join(10)
    login.stdout.close()
    assert "Signed in as olga" in "".join(lines)
    credentials = json.loads((laptop / "credentials").read_text())
    assert oct((laptop / "credentials").stat().st_mode & 0o777) == "0o600"
    assert credentials["token"].startswith("rpt_") and credentials["refresh_token"]

    # olga is an installation admin and an ml admin (her groups); the CLI and the SDK use what `raypod login` stored
    listed = subprocess.run([str(bin_dir / "raypod"), "cluster", "list"], env=env, capture_output=True, text=True)
    assert listed.returncode == 0, listed.stderr
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        with Client() as api:
            assert api.request("GET", "/api/v1/whoami")["teams"] == {"ml": "admin"}
            assert SHARED_CLUSTER in {view.spec.name for view in api.clusters.list()}
    submitted = subprocess.run(
        [str(bin_dir / "ray"), "job", "submit", "--address", f"raypod://{SHARED_CLUSTER}", "--", *HELLO],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert submitted.returncode == 0 and "hello from sso" in submitted.stdout, submitted.stderr[-2000:]

    # the token is near its end: the next call refreshes it through the provider
    credentials["token_expires_at"] = "2000-01-01T00:00:00+00:00"
    (laptop / "credentials").write_text(json.dumps(credentials))
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        with Client() as api:
            assert api.request("GET", "/api/v1/whoami")["name"] == "olga"
    renewed = json.loads((laptop / "credentials").read_text())
    assert renewed["token"] != credentials["token"] and renewed["token_expires_at"] > "2001"

    # removed from every group raypod maps: the next refresh is refused and her SSO tokens are revoked
    provider.set_accounts({"ada": ["ml-engineers"], "olga": ["marketing"]})
    with httpx.Client(verify=tls_verify(server.ca_file)) as http:
        refused = http.post(f"{server.url}/api/v1/sso/refresh", json={"refresh_token": renewed["refresh_token"]})
        assert refused.status_code == 403 and "none of the groups" in refused.json()["message"]
        stale = http.get(f"{server.url}/api/v1/whoami", headers={"Authorization": f"Bearer {renewed['token']}"})
        assert stale.status_code == 401
