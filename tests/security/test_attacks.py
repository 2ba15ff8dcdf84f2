"""One test per attack of issue 12 on raypod itself (in-process app, fake backend). Attacks through the gateway
on a real Ray dashboard are in test_gateway_attacks.py."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from raypod.controlplane import identity
from raypod.controlplane.jobs.attribution import PROOF
from raypod.server import gateway, tls
from tests.security.conftest import App, EchoBackend, EchoDashboard, make_app


def wait_ready(app: App, namespace: str, name: str) -> None:
    deadline = time.monotonic() + 10
    while (
        app.http.get(f"/api/v1/namespaces/{namespace}/clusters/{name}", headers=app.as_("admin")).json()["status"][
            "phase"
        ]
        != "Ready"
    ):
        assert time.monotonic() < deadline
        time.sleep(0.05)


# -- sessions and tokens -----------------------------------------------------------------------------------------


def test_revoking_a_token_ends_its_browser_sessions_at_once(app: App) -> None:
    csrf = app.login(app.tokens["alice"])
    assert app.http.get("/api/v1/whoami").json()["name"] == "alice"
    token_id = app.tokens["alice"].split("_")[1]
    assert app.http.delete(f"/api/v1/tokens/{token_id}", headers=app.as_("admin")).status_code == 200
    after = app.http.get("/api/v1/whoami")
    assert after.status_code == 401 and "log in again" in after.json()["message"]
    created = app.http.post(
        "/api/v1/tokens", json={"name": "x"}, headers={"x-csrf-token": csrf, "Sec-Fetch-Site": "same-origin"}
    )
    assert created.status_code == 401


def test_a_session_cannot_mint_a_token_that_outlives_it(app: App) -> None:
    csrf = app.login(app.tokens["alice"])
    headers = {"x-csrf-token": csrf, "Sec-Fetch-Site": "same-origin"}
    year = app.http.post("/api/v1/tokens", json={"name": "y", "ttl_seconds": 366 * 86400}, headers=headers)
    assert year.status_code == 422 and "browser session" in year.json()["message"]
    forever = app.http.post("/api/v1/tokens", json={"name": "f", "ttl_seconds": None}, headers=headers)
    assert forever.status_code == 422
    hour = app.http.post("/api/v1/tokens", json={"name": "h", "ttl_seconds": 3600}, headers=headers)
    assert hour.status_code == 201
    expires = datetime.fromisoformat(hour.json()["expires_at"])
    assert expires - datetime.now(UTC) < timedelta(hours=1, minutes=1)
    # With its API token (no session) a user may still make long-lived tokens, up to that token's own end.
    api = app.http.post("/api/v1/tokens", json={"name": "ci", "ttl_seconds": 20 * 86400}, headers=app.as_("alice"))
    assert api.status_code == 201


def test_a_session_lasts_no_longer_than_its_token(app: App) -> None:
    short = app.http.post("/api/v1/tokens", json={"name": "s", "ttl_seconds": 2}, headers=app.as_("alice")).json()
    app.login(short["token"])
    assert app.http.get("/api/v1/whoami").status_code == 200
    time.sleep(2.2)
    assert app.http.get("/api/v1/whoami").status_code == 401


def test_a_role_change_takes_effect_at_once_despite_the_token_cache(app: App) -> None:
    app.cluster("train", owner="alice")
    wait_ready(app, "ml", "train")
    scale = {"group": "cpu", "replicas": 1}
    path = "/api/v1/namespaces/ml/clusters/train/scale"
    assert app.http.post(path, json=scale, headers=app.as_("bob")).status_code == 403  # caches bob's principal
    promoted = app.http.post(
        "/api/v1/teams/ml/members", json={"user": "bob", "role": "admin"}, headers=app.as_("admin")
    )
    assert promoted.status_code == 201
    assert app.http.post(path, json=scale, headers=app.as_("bob")).status_code == 202
    app.http.post("/api/v1/teams/ml/members", json={"user": "bob", "role": "member"}, headers=app.as_("admin"))
    assert app.http.post(path, json=scale, headers=app.as_("bob")).status_code == 403


def test_tokens_are_parsed_in_one_place() -> None:
    for bad in ("", "rpt", "rpt_", "rpt__x", "rpt_id_", "abc_id_secret", "rpt_" + "a" * 300):
        with pytest.raises(Exception, match="malformed token"):
            identity.parse_token(bad)
    assert identity.parse_token("rpt_abc_s3cr_et") == ("abc", "s3cr_et")


# -- existence leak ------------------------------------------------------------------------------------------------


def test_the_gateway_does_not_tell_outsiders_which_clusters_exist(app: App) -> None:
    app.cluster("alpha", owner="alice")
    hidden = app.http.get("/clusters/ml/alpha/api/version", headers=app.as_("dave"))
    missing = app.http.get("/clusters/ml/nope/api/version", headers=app.as_("dave"))
    assert hidden.status_code == missing.status_code == 404
    assert hidden.json()["message"] == "cluster 'alpha' not found in namespace 'ml'"
    assert missing.json()["message"] == "cluster 'nope' not found in namespace 'ml'"
    member = app.http.get("/clusters/ml/nope/api/version", headers=app.as_("bob"))
    assert member.status_code == 404 and "alpha" not in member.text


# -- bodies and limits ---------------------------------------------------------------------------------------------


def test_a_working_dir_upload_without_rights_is_refused(app: App) -> None:
    app.cluster("train", owner="alice")
    wait_ready(app, "ml", "train")
    files = [("files", ("proj/a.py", b"x" * 1000))]
    path = "/api/v1/namespaces/ml/clusters/train/working-dirs"
    assert app.http.post(path, files=files, headers=app.as_("bob")).status_code == 403
    assert app.http.post(path, files=files, headers=app.as_("dave")).status_code == 403
    assert app.http.post(path, files=files, headers=app.as_("alice")).status_code == 201


@pytest.fixture
def small_limits(tmp_path: Path) -> Iterator[App]:
    yield from make_app(tmp_path, max_upload_bytes=64 * 1024, max_json_body_bytes=16 * 1024)


def test_an_upload_over_the_cap_is_413_whatever_its_declared_length(small_limits: App) -> None:
    app = small_limits
    app.cluster("train", owner="alice")
    wait_ready(app, "ml", "train")
    path = "/api/v1/namespaces/ml/clusters/train/working-dirs"
    too_big = app.http.post(path, files=[("files", ("a.bin", b"\0" * 100_000))], headers=app.as_("alice"))
    assert too_big.status_code == 413 and too_big.json()["code"] == "payload_too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: the cap counts what arrives
        boundary = b"--b\r\nContent-Disposition: form-data; name=files; filename=a.bin\r\n\r\n"
        yield boundary
        for _ in range(20):
            yield b"\0" * 8192

    streamed = app.http.post(
        path, content=chunks(), headers={**app.as_("alice"), "Content-Type": "multipart/form-data; boundary=b"}
    )
    assert streamed.status_code == 413


def test_a_json_body_over_the_limit_is_413(small_limits: App) -> None:
    body = json.dumps({"name": "big", "namespace": "ml", "env": {f"K{i}": "v" * 100 for i in range(300)}})
    answer = small_limits.http.post(
        "/api/v1/clusters", content=body, headers={**small_limits.as_("alice"), "Content-Type": "application/json"}
    )
    assert answer.status_code == 413


def test_non_finite_numbers_in_a_spec_are_422_not_500(app: App) -> None:
    for raw in (
        '{"name": "x", "namespace": "ml", "head": {"memory": 1e400}}',
        '{"name": "x", "namespace": "ml", "worker_groups": [{"name": "g", "resources": {"r": 1e999}}]}',
    ):
        answer = app.http.post(
            "/api/v1/clusters", content=raw, headers={**app.as_("alice"), "Content-Type": "application/json"}
        )
        assert answer.status_code == 422, answer.text


def test_env_values_that_would_break_node_start_are_refused(app: App) -> None:
    body = {"name": "x", "namespace": "ml", "env": {"HUGE": "v" * 200_000}}
    answer = app.http.post("/api/v1/clusters", json=body, headers=app.as_("alice"))
    assert answer.status_code == 422 and "HUGE" in answer.json()["message"]
    runtime_env = {"name": "x", "namespace": "ml", "runtime_env": {"env_vars": {"A": "v" * 100_000}}}
    assert app.http.post("/api/v1/clusters", json=runtime_env, headers=app.as_("alice")).status_code == 422


# -- hardening -----------------------------------------------------------------------------------------------------


def test_the_database_and_state_files_are_private(app: App) -> None:
    app.cluster("train", owner="alice")
    home = app.home
    assert home.stat().st_mode & 0o777 == 0o700
    files = [p for p in home.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"raypod.db", "credentials"}
    leaky = [str(p) for p in files if p.stat().st_mode & 0o077]
    assert leaky == []


def test_a_cross_origin_login_is_refused(app: App) -> None:
    forged = app.http.post("/login", data={"token": app.admin}, headers={"Origin": "https://evil.example"})
    assert forged.status_code == 403
    cross_site = app.http.post("/login", data={"token": app.admin}, headers={"Sec-Fetch-Site": "cross-site"})
    assert cross_site.status_code == 403
    same = app.http.post("/login", data={"token": app.admin}, headers={"Origin": "http://testserver"})
    assert same.status_code == 200


def test_a_cross_site_cookie_change_is_refused_even_with_the_csrf_token(app: App) -> None:
    csrf = app.login(app.tokens["alice"])
    body = {"name": "s", "namespace": "ml"}
    forged = app.http.post(
        "/api/v1/clusters", json=body, headers={"x-csrf-token": csrf, "Sec-Fetch-Site": "cross-site"}
    )
    assert forged.status_code == 403
    other = app.http.post(
        "/api/v1/clusters", json=body, headers={"x-csrf-token": csrf, "Origin": "https://evil.example"}
    )
    assert other.status_code == 403
    own = app.http.post("/api/v1/clusters", json=body, headers={"x-csrf-token": csrf, "Origin": "http://testserver"})
    assert own.status_code == 202


def test_the_self_signed_certificate_is_a_leaf_of_a_local_ca(tmp_path: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec

    cert_path, key_path = tls.self_signed(tmp_path, "127.0.0.1")
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    ca = x509.load_pem_x509_certificate(tls.ca_path(tmp_path).read_bytes())
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in names.get_values_for_type(x509.DNSName)
    assert [str(a) for a in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert cert.issuer == ca.subject
    public = ca.public_key()
    assert isinstance(public, ec.EllipticCurvePublicKey)
    public.verify(cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(cert.signature_hash_algorithm))  # type: ignore[arg-type]
    for private in (key_path, tmp_path / "tls" / "ca.key"):
        assert private.stat().st_mode & 0o777 == 0o600


# -- what the gateway forwards (to a stand-in dashboard that echoes it) ---------------------------------------------


@pytest.fixture
def echo(tmp_path: Path) -> Iterator[tuple[App, EchoDashboard]]:
    dashboard = EchoDashboard()
    try:
        for made in make_app(tmp_path, backend=EchoBackend(dashboard), gateway_read_timeout_s=1.0):
            made.cluster("train", owner="alice")
            wait_ready(made, "ml", "train")
            yield made, dashboard
    finally:
        dashboard.close()


def test_the_gateway_forwards_only_allowed_headers_and_sets_forwarded_ones(echo: tuple[App, EchoDashboard]) -> None:
    app, dashboard = echo
    sent = {
        **app.as_("bob"),
        "Accept": "application/json",
        "X-Forwarded-For": "6.6.6.6",
        "Forwarded": "for=6.6.6.6",
        "X-Forwarded-Host": "evil.example",
        "X-Ray-Internal": "1",
        "Cookie": "raypod_session=stolen",
        "X-Csrf-Token": "x",
    }
    answer = app.http.get("/clusters/ml/train/api/version", headers=sent)
    assert answer.status_code == 200, answer.text
    headers = answer.json()["headers"]
    assert (
        headers["authorization"] == f"Bearer ray-token-of-{dashboard.received[-1]['headers'] and ''}".rstrip() or True
    )
    assert headers["authorization"].startswith("Bearer ray-token-of-")  # raypod's Ray credential, not bob's token
    assert headers["accept"] == "application/json"
    assert headers["x-forwarded-for"] != "6.6.6.6" and headers["x-forwarded-host"] == "testserver"
    assert headers["x-forwarded-prefix"] == "/clusters/ml/train"
    for private in ("forwarded", "x-ray-internal", "cookie", "x-csrf-token", "content-length", "transfer-encoding"):
        assert private not in headers, private


def test_a_read_with_a_body_is_refused_and_never_reaches_the_dashboard(echo: tuple[App, EchoDashboard]) -> None:
    app, dashboard = echo
    smuggled = b"POST /api/jobs/ HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
    for method in ("GET", "HEAD", "OPTIONS"):
        before = len(dashboard.received)
        answer = app.http.request(method, "/clusters/ml/train/api/version", content=smuggled, headers=app.as_("bob"))
        assert answer.status_code == 400, (method, answer.text)
        assert len(dashboard.received) == before, f"{method} with a body reached the dashboard"


def test_a_write_forwards_its_body_with_a_matching_length(echo: tuple[App, EchoDashboard]) -> None:
    app, dashboard = echo
    answer = app.http.post("/clusters/ml/train/api/jobs/", json={"entrypoint": "echo hi"}, headers=app.as_("alice"))
    assert answer.status_code == 200
    received = dashboard.received[-1]
    # The gateway writes who submitted it into the job's metadata, signed, for raypod's job list; and an id.
    forwarded = json.loads(received["body"])
    assert forwarded["entrypoint"] == "echo hi" and forwarded["submission_id"].startswith("raysubmit_")
    assert forwarded["metadata"]["raypod.submitted_by"] == "alice" and forwarded["metadata"][PROOF]
    assert int(received["headers"]["Content-Length"]) == len(received["body"])
    assert app.http.post("/clusters/ml/train/api/jobs/", json={}, headers=app.as_("bob")).status_code == 403


def test_a_submission_cannot_claim_another_submitter(echo: tuple[App, EchoDashboard]) -> None:
    app, dashboard = echo
    spoofed = {"entrypoint": "echo hi", "metadata": {"raypod.submitted_by": "admin", "team": "ml", PROOF: "x"}}
    assert app.http.post("/clusters/ml/train/api/jobs/", json=spoofed, headers=app.as_("alice")).status_code == 200
    metadata = json.loads(dashboard.received[-1]["body"])["metadata"]
    assert metadata["raypod.submitted_by"] == "alice" and metadata["team"] == "ml" and metadata[PROOF] != "x"


def test_code_on_a_cluster_cannot_make_raypod_attribute_its_jobs_to_someone_else(app: App) -> None:
    """A job submits to its own cluster's dashboard directly (it can reach it, and read every job's metadata):
    neither a claimed submitter nor a signed job's metadata copied onto another submission makes raypod list it
    as that user's. Only what the gateway signed for this very job is believed (the gateway's signing is the test
    above's; here the server's own signer stands for it, as the fake backend's Ray has no dashboard to proxy)."""
    uid = app.cluster("train", owner="alice")["uid"]
    wait_ready(app, "ml", "train")
    body = {"entrypoint": "python train.py", "runtime_env": {"working_dir": "gcs://_ray_pkg_a.zip"}}
    signed = app.http.app.state.jobs.attribution.sign("ml", "train", body, "alice")  # type: ignore[attr-defined]
    submit = app.backend.ray_submit
    runs = {"runtime_env": signed["runtime_env"], "metadata": signed["metadata"]}
    submit(uid, signed["submission_id"], "python train.py", **runs)
    submit(uid, "raysubmit_claimed", "python evil.py", metadata={"raypod.submitted_by": "alice"})
    submit(uid, "raysubmit_odd", "python evil.py", metadata={"raypod.submitted_by": "alice", PROOF: "é" * 64})
    submit(uid, "raysubmit_copied", "python train.py", **runs)
    evil = {"working_dir": "gcs://_ray_pkg_evil.zip"}
    submit(uid, signed["submission_id"] + "x", "python train.py", runtime_env=evil, metadata=signed["metadata"])

    def owners() -> dict[str, str]:
        jobs = app.http.get("/api/v1/jobs?namespace=ml", headers=app.as_("alice")).json()
        return {job["attempts"][0]["submission_id"]: job["owner"] for job in jobs}

    deadline = time.monotonic() + 15
    while len(owners()) < 5:
        assert time.monotonic() < deadline, owners()
        time.sleep(0.1)
    assert owners() == {
        signed["submission_id"]: "alice",
        "raysubmit_claimed": "",
        "raysubmit_odd": "",
        "raysubmit_copied": "",
        signed["submission_id"] + "x": "",
    }
    attribution = app.http.app.state.jobs.attribution  # type: ignore[attr-defined]
    assert attribution.submitter("ml", "train", {**signed, "runtime_env": evil}) == "", "other code, same id"
    assert attribution.submitter("ml", "other", signed) == "", "another cluster"
    assert attribution.submitter("ml", "train", signed) == "alice"


def test_a_dashboard_that_does_not_answer_times_out(echo: tuple[App, EchoDashboard]) -> None:
    app, _ = echo
    started = time.monotonic()
    answer = app.http.get("/clusters/ml/train/slow", headers=app.as_("bob"))
    assert answer.status_code == 503 and "in time" in answer.json()["message"]
    assert time.monotonic() - started < 10


def test_one_user_cannot_hold_more_than_the_in_flight_limit() -> None:
    limit = gateway.ConcurrencyLimit(2)
    with limit.hold("bob", "ml", "train"), limit.hold("bob", "ml", "train"):
        with pytest.raises(Exception, match="2 requests in flight"), limit.hold("bob", "ml", "train"):
            pass
        with limit.hold("alice", "ml", "train"):  # another user is not affected
            pass
    with limit.hold("bob", "ml", "train"):  # released again
        pass


def test_viewers_cannot_operate_through_the_gateway(echo: tuple[App, EchoDashboard]) -> None:
    app, dashboard = echo
    before = len(dashboard.received)
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        answer = app.http.request(method, "/clusters/ml/train/api/jobs/", content=b"{}", headers=app.as_("bob"))
        assert answer.status_code == 403, method
    assert len(dashboard.received) == before


class RayServiceBackend(EchoBackend):
    """The echo backend, serving application 'chat' at its own Serve proxy (a RayService's, on Kubernetes)."""

    kueue = False

    def __init__(self, dashboard: EchoDashboard, serve: EchoDashboard) -> None:
        super().__init__(dashboard)
        self.serve = serve

    def apply_rayservice(self, cluster_id: str, manifest: dict[str, Any]) -> None: ...

    def rayservice_state(self, namespace: str, name: str) -> None:
        return None

    def delete_rayservice(self, namespace: str, name: str) -> None: ...

    def serve_endpoints(self, cluster_id: str) -> dict[str, str]:
        return {"chat": self.serve.url}


def test_a_rayservice_app_is_reached_at_its_own_serve_proxy_without_the_clusters_ray_token(tmp_path: Path) -> None:
    dashboard, serve = EchoDashboard(), EchoDashboard()
    try:
        for app in make_app(tmp_path, backend=RayServiceBackend(dashboard, serve)):
            app.cluster("train", owner="alice")
            wait_ready(app, "ml", "train")
            answer = app.http.get("/clusters/ml/train/serve/chat/v1/models", headers=app.as_("bob"))
            assert answer.status_code == 200, answer.text
            assert [r["path"] for r in serve.received] == ["/chat/v1/models"] and not dashboard.received
            assert "ray-token-of" not in json.dumps(answer.json()["headers"]), "the Ray token stays off Serve's path"
            other = app.http.get("/clusters/ml/train/serve/other/v1/models", headers=app.as_("bob"))
            assert other.status_code == 409 and "no Serve endpoint" in other.json()["message"]
            assert app.http.get("/clusters/ml/train/serve/chat/v1/models", headers=app.as_("dave")).status_code in (
                403,
                404,
            )
    finally:
        dashboard.close()
        serve.close()
