"""One test per finding of the tenant-boundary review (issue 28), named after the attack, in-process with the fake
backend (what a node's processes can write is written by the test, as a job on the node would). The attacks on the
local backend's sandbox and environment are in test_node_privileges.py; those through the gateway's origins in
test_origins.py."""

from __future__ import annotations

import json
import logging
import os
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets.sync.server
from starlette.websockets import WebSocketDisconnect

from raypod import errors, outbound, untrusted_files
from raypod.capabilities.hangwatch import layout
from raypod.capabilities.spaces import ide
from tests.security.conftest import App, EchoBackend, EchoDashboard, make_app
from tests.security.test_attacks import wait_ready
from tests.server.test_hangwatch import wait_for


@pytest.fixture
def echo_server() -> Iterator[EchoDashboard]:
    """An HTTP server on loopback that records every request it gets (a stand-in for what a server-side request
    forgery would reach: the metadata service, an internal admin port)."""
    server = EchoDashboard()
    yield server
    server.close()


def alices_job(app: App) -> dict[str, Any]:
    """Alice's cluster ml/train, Ready, with a job of hers on it."""
    app.cluster("train", owner="alice")
    wait_ready(app, "ml", "train")
    submitted = app.http.post(
        "/api/v1/namespaces/ml/clusters/train/jobs", json={"entrypoint": "python t.py"}, headers=app.as_("alice")
    )
    assert submitted.status_code == 202, submitted.text
    job: dict[str, Any] = submitted.json()
    return job


# -- 1. nothing a user supplies runs in the server ----------------------------------------------------------------


def fake_env(root: Path, marker: Path, *, ray: str | None, ipykernel: bool) -> Path:
    """A directory a job could have written: a ``bin/python`` that records who ran it, and package metadata."""
    (root / "bin").mkdir(parents=True)
    python = root / "bin" / "python"
    python.write_text(f"#!/bin/sh\nid -u > {marker}\necho 2.60.0\n")
    python.chmod(0o755)
    site = root / "lib" / "python3.11" / "site-packages"
    for name, version in (("ray", ray), ("ipykernel", "7.0.0" if ipykernel else None)):
        if version is not None:
            (site / f"{name}-{version}.dist-info").mkdir(parents=True)
            (site / f"{name}-{version}.dist-info" / "METADATA").write_text(
                f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nbody\n"
            )
    return root


def test_a_workspace_python_env_is_inspected_never_run_by_the_server(app: App, tmp_path: Path) -> None:
    app.cluster("train", owner="alice")
    wait_ready(app, "ml", "train")
    marker = tmp_path / "ran-as"
    bare = fake_env(tmp_path / "bare", marker, ray=None, ipykernel=False)
    body = {"name": "nb", "cluster": "train", "python_env": str(bare)}
    refused = app.http.post("/api/v1/namespaces/ml/spaces", json=body, headers=app.as_("alice"))
    assert refused.status_code == 422 and "lacks ipykernel or Ray" in refused.json()["message"]
    ray_version = app.http.get("/api/v1/namespaces/ml/clusters/train", headers=app.as_("alice")).json()["spec"][
        "ray_version"
    ]
    good = fake_env(tmp_path / "good", marker, ray=ray_version, ipykernel=True)
    body["python_env"] = str(good)
    created = app.http.post("/api/v1/namespaces/ml/spaces", json=body, headers=app.as_("alice"))
    assert created.status_code == 201, created.text
    other = fake_env(tmp_path / "old", marker, ray="2.1.0", ipykernel=True)
    body.update(name="nb2", python_env=str(other))
    older = app.http.post("/api/v1/namespaces/ml/spaces", json=body, headers=app.as_("alice"))
    assert older.status_code == 422 and "has Ray 2.1.0" in older.json()["message"]
    assert not marker.exists(), "the server ran the environment's interpreter"


def test_a_python_env_check_does_not_tell_which_server_paths_exist(app: App, tmp_path: Path) -> None:
    app.cluster("train", owner="alice")
    wait_ready(app, "ml", "train")
    answers = []
    for path in ("/etc", "/no/such/dir"):
        body = {"name": "nb", "cluster": "train", "python_env": path}
        answers.append(app.http.post("/api/v1/namespaces/ml/spaces", json=body, headers=app.as_("alice")).json())
    assert answers[0]["message"] == answers[1]["message"]


# -- 3. hang files are untrusted data -----------------------------------------------------------------------------


RUN, ATTEMPT = "f" * 32, "a" * 16


def detection(job: str | None, action: str, *, ray_job: str = "02000000") -> dict[str, Any]:
    now = time.time()
    return {
        "run_id": RUN,
        "run": "demo",
        "attempt": ATTEMPT,
        "job_id": ray_job,
        "raypod_job": job,
        "kind": "hang",
        "reason": "no progress",
        "detected_at": now,
        "action": action,
        "hangs_without_progress": 9,
        "ranks": [{"rank": 0, "node": "cpu-0", "pid": 10, "reports": 1, "last_report": now - 30}],
    }


def hangwatch_dirs(app: App, tmp_path: Path, namespace: str, name: str) -> dict[str, Path]:
    uid = app.http.get(f"/api/v1/namespaces/{namespace}/clusters/{name}", headers=app.as_("admin")).json()["uid"]
    roots = {"cpu-0": tmp_path / name / "n0"}  # each node's add-on directory; hang detection's is inside
    dirs = {node: root / "hangwatch" for node, root in roots.items()}
    dirs["cpu-0"].mkdir(parents=True)
    app.backend.addon_roots[uid] = roots
    return dirs


def other_team_cluster(app: App) -> None:
    body = {"name": "theirs", "namespace": "other", "worker_groups": [{"name": "cpu", "replicas": 0}]}
    assert app.http.post("/api/v1/clusters", json=body, headers=app.as_("dave")).status_code == 202
    wait_ready(app, "other", "theirs")


def test_a_detection_file_on_one_teams_cluster_cannot_fail_another_teams_job(app: App, tmp_path: Path) -> None:
    job = alices_job(app)
    other_team_cluster(app)
    theirs = hangwatch_dirs(app, tmp_path, "other", "theirs")
    layout.write_json(layout.detections_dir(theirs["cpu-0"]) / "d.json", detection(job["id"], "fail-job"))
    wait_for(
        lambda: app.http.get("/api/v1/namespaces/other/clusters/theirs/hangs", headers=app.as_("dave")).json(),
        "the detection recorded",
    )
    recorded = app.http.get("/api/v1/namespaces/other/clusters/theirs/hangs", headers=app.as_("dave")).json()
    assert recorded[0]["job"] is None and recorded[0]["action"] == "notify"
    assert app.http.get(f"/api/v1/jobs/{job['id']}", headers=app.as_("alice")).json()["status"] != "FAILED"


def test_a_detection_file_names_no_job_and_no_action_even_on_its_own_cluster(app: App, tmp_path: Path) -> None:
    job = alices_job(app)
    ours = hangwatch_dirs(app, tmp_path, "ml", "train")
    layout.write_json(layout.detections_dir(ours["cpu-0"]) / "d.json", detection(job["id"], "fail-job"))
    found = wait_for(
        lambda: app.http.get("/api/v1/namespaces/ml/clusters/train/hangs", headers=app.as_("alice")).json(),
        "the detection recorded",
    )
    assert found[0]["action"] == "notify"
    assert app.http.get(f"/api/v1/jobs/{job['id']}", headers=app.as_("alice")).json()["status"] != "FAILED"


def test_a_requested_failure_refuses_a_job_of_another_cluster(app: App) -> None:
    job = alices_job(app)
    other_team_cluster(app)
    jobs = app.http.app.state.jobs  # type: ignore[attr-defined]
    theirs = app.http.app.state.clusters.store.get("other", "theirs")  # type: ignore[attr-defined]
    try:
        jobs.request_failure(job["id"], "forged", theirs)
    except Exception as exc:  # the refusal is the point
        assert "not found on cluster other/theirs" in str(exc)
    else:
        raise AssertionError("a job of ml/train was failed for other/theirs")
    assert app.http.get(f"/api/v1/jobs/{job['id']}", headers=app.as_("alice")).json()["status"] != "FAILED"


def test_bad_hang_files_never_stop_the_pass_for_other_clusters(app: App, tmp_path: Path) -> None:
    app.cluster("bad", owner="alice")  # ml/bad is collected before other/theirs
    wait_ready(app, "ml", "bad")
    other_team_cluster(app)
    bad = hangwatch_dirs(app, tmp_path, "ml", "bad")["cpu-0"]
    (bad / "status.json").write_text(json.dumps({"time": "x", "runs": "nope"}))
    layout.detections_dir(bad).mkdir()
    (layout.detections_dir(bad) / "big.json").write_bytes(b" " * (5 * 2**20) + b"{}")
    (layout.detections_dir(bad) / "list.json").write_text("[1, 2]")
    (layout.detections_dir(bad) / "types.json").write_text(json.dumps({**detection(None, "x"), "ranks": 5}))
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({**detection(None, "notify"), "reason": "the server's secret"}))
    (layout.detections_dir(bad) / "link.json").symlink_to(secret)
    theirs = hangwatch_dirs(app, tmp_path, "other", "theirs")["cpu-0"]
    layout.write_json(layout.detections_dir(theirs) / "d.json", detection(None, "notify"))
    wait_for(
        lambda: app.http.get("/api/v1/namespaces/other/clusters/theirs/hangs", headers=app.as_("dave")).json(),
        "the other cluster's detection",
    )
    assert app.http.get("/api/v1/namespaces/ml/clusters/bad/hangs", headers=app.as_("alice")).json() == []


def hung_status(world_size: int = 1) -> dict[str, Any]:
    now = time.time()
    rank = {"rank": 0, "node": "cpu-0", "pid": 10, "reports": 4, "last_report": now - 60, "stalled_s": 30.0}
    run = {"run_id": RUN, "attempt": ATTEMPT, "job_id": "02000000", "world_size": world_size, "enabled": True}
    return {"time": now, "poll_s": 0.2, "runs": [{**run, "ranks": [{**rank, "timeout_s": 20.0}]}]}


def test_the_server_writes_no_hang_request_through_a_link_a_job_planted(app: App, tmp_path: Path) -> None:
    app.cluster("train", owner="alice")
    wait_ready(app, "ml", "train")
    node = hangwatch_dirs(app, tmp_path, "ml", "train")["cpu-0"]
    target = tmp_path / "elsewhere"
    target.mkdir()
    (node / "requests").symlink_to(target)
    layout.write_json(node / "status.json", hung_status())
    wait_for(
        lambda: any(
            r["hung"]
            for r in app.http.get("/api/v1/namespaces/ml/clusters/train/training", headers=app.as_("alice")).json()
        ),
        "the run judged hung",
    )
    (node / "requests").unlink()
    layout.write_json(node / "status.json", {**hung_status(), "runs": [{**hung_status()["runs"][0], "attempt": "b"}]})
    wait_for(lambda: list((node / "requests").glob("*.json")), "a request written where it belongs")
    assert list(target.iterdir()) == []


def test_untrusted_files_follow_no_link_and_read_no_oversized_file(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "a.json").write_text('{"a": 1}')
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert untrusted_files.read_json(tmp_path, "real/a.json", 100) == {"a": 1}
    assert untrusted_files.read_json(tmp_path, "link/a.json", 100) is None
    assert untrusted_files.read_json(tmp_path, "real/a.json", 4) is None
    assert untrusted_files.list_names(tmp_path, "link", ".json", 10) == []
    untrusted_files.write_json(tmp_path, "fresh/r.json", {"a": 1})
    assert stat.S_IMODE(os.stat(tmp_path / "fresh").st_mode) == 0o700
    assert untrusted_files.read_json(tmp_path, "fresh/r.json", 100) == {"a": 1}


# -- 4. workspace identity ----------------------------------------------------------------------------------------


def test_a_cluster_create_cannot_take_another_users_workspace_name(app: App) -> None:
    body = {"name": "nb", "cluster": "train"}
    app.cluster("train", owner="alice")
    wait_ready(app, "ml", "train")
    assert app.http.post("/api/v1/namespaces/ml/spaces", json=body, headers=app.as_("alice")).status_code == 201
    hijack = {
        "name": "mine",
        "namespace": "ml",
        "worker_groups": [{"name": "cpu", "replicas": 0}],
        "spaces": [{"name": "nb", "owner": "bob"}],
    }
    refused = app.http.post("/api/v1/clusters", json=hijack, headers=app.as_("bob"))
    assert refused.status_code == 409 and "already exists" in refused.json()["message"]
    assert app.http.get("/api/v1/namespaces/ml/spaces/nb", headers=app.as_("alice")).json()["cluster"] == "train"


def test_a_workspaces_owner_is_its_creator_unless_an_admin_names_one(app: App) -> None:
    spec = {
        "name": "bobs",
        "namespace": "ml",
        "worker_groups": [{"name": "cpu", "replicas": 0}],
        "spaces": [{"name": "nb-b", "owner": "alice"}],
    }
    assert app.http.post("/api/v1/clusters", json=spec, headers=app.as_("bob")).status_code == 202
    assert app.http.get("/api/v1/namespaces/ml/spaces/nb-b", headers=app.as_("bob")).json()["owner"] == "bob"
    spec.update(name="carols", spaces=[{"name": "nb-c", "owner": "alice"}])
    assert app.http.post("/api/v1/clusters", json=spec, headers=app.as_("carol")).status_code == 202
    assert app.http.get("/api/v1/namespaces/ml/spaces/nb-c", headers=app.as_("alice")).json()["owner"] == "alice"


def test_workspace_files_are_keyed_by_an_id_not_by_a_name_another_user_can_reuse(tmp_path: Path) -> None:
    alices = ide.files_dir(tmp_path, "ml", "nb", "alice")
    bobs = ide.files_dir(tmp_path, "ml", "nb", "bob")
    assert alices != bobs and alices == ide.files_dir(tmp_path, "ml", "nb", "alice")
    assert "nb" not in alices.relative_to(tmp_path).parts


# -- 6. token lineage ---------------------------------------------------------------------------------------------


def test_a_token_made_by_a_sessions_token_cannot_outlive_it_nor_survive_its_revocation(app: App) -> None:
    csrf = app.login(app.tokens["alice"])
    headers = {"x-csrf-token": csrf, "Sec-Fetch-Site": "same-origin"}
    day = app.http.post("/api/v1/tokens", json={"name": "day", "ttl_seconds": 86000}, headers=headers)
    assert day.status_code == 201, day.text
    app.http.cookies.clear()
    child = {"Authorization": f"Bearer {day.json()['token']}"}
    forever = app.http.post("/api/v1/tokens", json={"name": "forever", "ttl_seconds": None}, headers=child)
    assert forever.status_code == 422 and "expires by" in forever.json()["message"]
    week = app.http.post("/api/v1/tokens", json={"name": "week", "ttl_seconds": 7 * 86400}, headers=child)
    assert week.status_code == 422
    hour = app.http.post("/api/v1/tokens", json={"name": "hour", "ttl_seconds": 3600}, headers=child)
    assert hour.status_code == 201 and hour.json()["parent"] == day.json()["id"]
    grandchild = {"Authorization": f"Bearer {hour.json()['token']}"}
    assert app.http.get("/api/v1/whoami", headers=grandchild).status_code == 200
    alices_token = app.tokens["alice"].split("_")[1]
    assert app.http.delete(f"/api/v1/tokens/{alices_token}", headers=app.as_("admin")).status_code == 200
    for descendant in (child, grandchild):
        assert app.http.get("/api/v1/whoami", headers=descendant).status_code == 401


def test_a_member_cannot_mint_or_revoke_another_users_token(app: App) -> None:
    minted = app.http.post("/api/v1/tokens", json={"name": "x", "user": "bob"}, headers=app.as_("alice"))
    assert minted.status_code == 403
    bobs = app.tokens["bob"].split("_")[1]
    assert app.http.delete(f"/api/v1/tokens/{bobs}", headers=app.as_("alice")).status_code in (403, 404)
    assert app.http.get("/api/v1/whoami", headers=app.as_("bob")).status_code == 200


# -- 5. outbound-fetch policy -------------------------------------------------------------------------------------


def test_a_member_cannot_add_or_squat_catalog_models(app: App, tmp_path: Path) -> None:
    for source in (str(tmp_path), "meta-llama/Llama-3.1-8B", "s3://bucket/model"):
        body = {"id": "meta-llama/Llama-3.1-8B", "source": source}
        refused = app.http.post("/api/v1/models", json=body, headers=app.as_("alice"))
        assert refused.status_code == 403 and "installation admins" in refused.json()["message"]
    assert app.http.get("/api/v1/models", headers=app.as_("alice")).json() == []


def test_a_catalog_source_on_loopback_or_link_local_is_refused_unless_the_operator_allows_it(
    app: App, echo_server: EchoDashboard
) -> None:
    sources = [
        {"id": "loop", "source": f"{echo_server.url}/model"},
        {"id": "meta", "source": "s3://b/m", "storage_options": {"endpoint_url": "http://169.254.169.254/"}},
        {"id": "meta2", "source": "s3://b/m", "storage_options": {"client_kwargs": {"endpoint_url": echo_server.url}}},
        {"id": "ssh", "source": "ssh://127.0.0.1/etc"},
    ]
    for body in sources:
        refused = app.http.post("/api/v1/models", json=body, headers=app.as_("admin"))
        assert refused.status_code in (403, 422) and "Traceback" not in refused.text, refused.text
    assert echo_server.received == [], "the server fetched from loopback"


def test_a_hang_webhook_is_never_posted_to_loopback(
    app: App, tmp_path: Path, echo_server: EchoDashboard, caplog: pytest.LogCaptureFixture
) -> None:
    body = {
        "name": "hooked",
        "namespace": "ml",
        "worker_groups": [{"name": "cpu", "replicas": 0}],
        "hangwatch": {"webhook_url": f"{echo_server.url}/hook"},
    }
    assert app.http.post("/api/v1/clusters", json=body, headers=app.as_("alice")).status_code == 202
    wait_ready(app, "ml", "hooked")
    node = hangwatch_dirs(app, tmp_path, "ml", "hooked")["cpu-0"]
    with caplog.at_level(logging.WARNING, logger="raypod.controlplane.hangwatch"):
        layout.write_json(layout.detections_dir(node) / "d.json", detection(None, "notify"))
        wait_for(lambda: "hang webhook to 127.0.0.1 refused" in caplog.text, "the webhook refused")
    assert echo_server.received == []


def test_the_outbound_policy_allows_what_an_operator_names_and_pins_the_checked_address(
    echo_server: EchoDashboard,
) -> None:
    policy = outbound.Policy.parse("127.0.0.1")
    with httpx.Client(timeout=5) as client:
        answer = outbound.pinned_request(client, "POST", f"{echo_server.url}/hook", policy, json={"a": 1})
    assert answer.status_code == 200 and echo_server.received[0]["path"] == "/hook"
    for refused in ("10.0.0.1", "172.16.0.1", "192.168.1.1", "169.254.169.254", "::1", "fe80::1", "100.64.0.1"):
        with pytest.raises(errors.Forbidden):
            outbound.check_host(refused, 80, outbound.Policy())
    with pytest.raises(errors.InvalidSpec):
        outbound.check_url("file:///etc/passwd", outbound.Policy())


# -- 7. limits and leaks ------------------------------------------------------------------------------------------


def test_a_team_admin_cannot_raise_their_own_teams_quota_but_divides_it(app: App) -> None:
    raised = app.http.put("/api/v1/teams/ml/quota", json={"cpus": 1000}, headers=app.as_("carol"))
    assert raised.status_code == 403 and "installation admins" in raised.json()["message"]
    assert app.http.put("/api/v1/teams/ml/quota", json={"cpus": 8}, headers=app.as_("admin")).status_code == 200
    divided = app.http.put("/api/v1/namespaces/ml/quota", json={"cpus": 4}, headers=app.as_("carol"))
    assert divided.status_code == 200, divided.text


def test_a_member_cannot_use_a_preempting_priority_unless_an_admin_allows_the_team(tmp_path: Path) -> None:
    body = {"name": "urgent", "namespace": "ml", "priority": "high", "worker_groups": []}
    for app in make_app(tmp_path / "default"):
        refused = app.http.post("/api/v1/clusters", json=body, headers=app.as_("alice"))
        assert refused.status_code == 403 and "RAYPOD_PRIORITY_TEAMS" in refused.json()["message"]
        assert app.http.post("/api/v1/clusters", json=body, headers=app.as_("admin")).status_code == 202
    for app in make_app(tmp_path / "allowed", priority_teams={"high": ("ml",)}):
        assert app.http.post("/api/v1/clusters", json=body, headers=app.as_("alice")).status_code == 202
        other = {**body, "namespace": "other"}
        assert app.http.post("/api/v1/clusters", json=other, headers=app.as_("dave")).status_code == 403


def test_a_team_admin_cannot_add_members_to_another_team(app: App) -> None:
    added = app.http.post("/api/v1/teams/other/members", json={"user": "carol"}, headers=app.as_("carol"))
    assert added.status_code == 403
    assert "other" not in app.http.get("/api/v1/whoami", headers=app.as_("carol")).json()["teams"]


def test_another_teams_job_answers_as_a_missing_one(app: App) -> None:
    job = alices_job(app)
    hidden = app.http.get(f"/api/v1/jobs/{job['id']}", headers=app.as_("dave"))
    missing = app.http.get("/api/v1/jobs/rj-0000000000", headers=app.as_("dave"))
    assert hidden.status_code == missing.status_code == 404
    assert hidden.json()["message"].replace(job["id"], "X") == missing.json()["message"].replace("rj-0000000000", "X")
    for verb in ("logs", "stop"):
        method = app.http.post if verb == "stop" else app.http.get
        assert method(f"/api/v1/jobs/{job['id']}/{verb}", headers=app.as_("dave")).status_code == 404


def test_a_refusal_names_no_team_and_is_the_same_for_a_namespace_that_does_not_exist(app: App) -> None:
    hidden = app.http.get("/api/v1/namespaces/ml/clusters", headers=app.as_("dave")).json()["message"]
    missing = app.http.get("/api/v1/namespaces/nope/clusters", headers=app.as_("dave")).json()["message"]
    assert hidden.replace("'ml'", "'X'") == missing.replace("'nope'", "'X'")
    assert "team 'ml'" not in hidden


def test_a_proxied_body_over_the_cap_is_413_before_it_reaches_the_cluster(tmp_path: Path) -> None:
    dashboard = EchoDashboard()
    try:
        for app in make_app(tmp_path, EchoBackend(dashboard), gateway_max_body_bytes=4096):
            app.cluster("train", owner="alice")
            wait_ready(app, "ml", "train")
            big = app.http.put("/clusters/ml/train/api/packages/x", content=b"x" * 8192, headers=app.as_("alice"))
            assert big.status_code == 413
            ok = app.http.put("/clusters/ml/train/api/packages/x", content=b"x" * 1024, headers=app.as_("alice"))
            assert ok.status_code == 200
    finally:
        dashboard.close()
    assert [r["path"] for r in dashboard.received] == ["/api/packages/x"]


def test_one_user_cannot_hold_more_websockets_than_the_in_flight_limit(tmp_path: Path) -> None:
    release = threading.Event()

    def hold(connection: Any) -> None:
        connection.send("open")
        release.wait(20)

    upstream = websockets.sync.server.serve(hold, "127.0.0.1", 0)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    dashboard = EchoDashboard()
    dashboard.url = f"http://127.0.0.1:{upstream.socket.getsockname()[1]}"
    try:
        for app in make_app(tmp_path, EchoBackend(dashboard), gateway_max_in_flight=2):
            app.cluster("train", owner="alice")
            wait_ready(app, "ml", "train")
            path = "/clusters/ml/train/api/logs"
            with (
                app.http.websocket_connect(path, headers=app.as_("alice")) as first,
                app.http.websocket_connect(path, headers=app.as_("alice")) as second,
            ):
                assert first.receive_text() == second.receive_text() == "open"
                with (
                    pytest.raises(WebSocketDisconnect) as third,
                    app.http.websocket_connect(path, headers=app.as_("alice")) as refused,
                ):
                    refused.receive_text()
                assert third.value.code == 4429
                with app.http.websocket_connect(path, headers=app.as_("bob")) as others:
                    assert others.receive_text() == "open", "the limit is per user"
            release.set()
    finally:
        release.set()
        upstream.shutdown()
        dashboard.close()


# -- 8. the suspected items: KubeRay pods ---------------------------------------------------------------------------


def test_kuberay_pods_get_no_api_token_and_a_restrictive_security_context(kuberay_crds: Path) -> None:
    from raypod import spec as spec_mod
    from raypod.backends.kuberay import manifests
    from tests.backends.kuberay.test_manifests import crd_schema

    spec = spec_mod.parse_spec({"name": "c", "worker_groups": [{"name": "w", "replicas": 1}]})
    documents = {
        "rayclusters": manifests.raycluster(spec)["spec"],
        "rayjobs": manifests.rayjob(
            spec,
            "j",
            entrypoint="python x.py",
            runtime_env={},
            max_retries=0,
            shutdown_after_finish=True,
            metadata={},
        )["spec"],
    }
    templates = [documents["rayclusters"]["headGroupSpec"]["template"]]
    templates += [group["template"] for group in documents["rayclusters"]["workerGroupSpecs"]]
    for template in templates:
        pod = template["spec"]
        assert pod["automountServiceAccountToken"] is False
        assert pod["securityContext"]["runAsNonRoot"] is True
        container = pod["containers"][0]["securityContext"]
        assert container == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    for kind, document in documents.items():
        schema = crd_schema(kuberay_crds / f"ray.io_{kind}.yaml")["properties"]["spec"]
        assert manifests.unknown_fields(document, schema) == [], kind


# -- 9. every route of the app, with real names ------------------------------------------------------------------

# What a team member who owns nothing, and a member of another team, may still change: their own tokens and
# sessions, and clusters of their own (in their own namespace).
SELF_SERVICE = {("POST", "/api/v1/tokens"), ("POST", "/login"), ("POST", "/logout"), ("POST", "/api/v1/clusters")}
# Reads a member of the namespace's team may make (others are for admins, or the owner of a workspace).
MEMBER_READS = ("/api/v1/namespaces/{namespace}/clusters", "/api/v1/jobs/")
MEMBER_LISTS = {"/api/v1/namespaces/{namespace}/spaces", "/api/v1/namespaces/{owner}/quota"}  # their own only
BODIES = {
    "/scale": {"group": "cpu", "replicas": 1},
    "/jobs": {"entrypoint": "python t.py"},
    "/spaces": {"name": "nb2", "cluster": "train"},
    "/move": {"cluster": "train"},
    "/deployments": {"model": "tiny"},
    "/quota": {"cpus": 1},
    "/members": {"user": "bob", "role": "admin"},
    "/users": {"name": "mallory", "is_admin": True},
    "/teams": {"name": "mallorys"},
    "/namespaces": {"name": "mallorys", "team": "ml"},
    "/models": {"id": "tiny", "source": "/etc"},
}


def test_no_route_of_the_app_lets_a_non_owner_or_an_outsider_change_or_see_what_is_not_theirs(app: App) -> None:
    """Routes from the app's own OpenAPI document, path parameters filled with real names (alice's cluster, job,
    workspace and token), as bob (same team, owns nothing) and dave (another team)."""
    job = alices_job(app)
    space = app.http.post(
        "/api/v1/namespaces/ml/spaces", json={"name": "nb", "cluster": "train"}, headers=app.as_("alice")
    )
    assert space.status_code == 201, space.text
    names = {
        "namespace": "ml",
        "name": "train",
        "node": "head",
        "action": "replace",
        "job_id": job["id"],
        "model_id": "tiny",
        "deployment": "tiny",
        "team": "ml",
        "owner": "ml",  # a team's or a namespace's quota
        "token_id": app.tokens["alice"].split("_")[1],
    }
    paths = app.http.app.openapi()["paths"]  # type: ignore[attr-defined]
    refused = 0
    scopes = ("teams", "namespaces")
    templates = [(t.replace("{scope}", scope), ops) for t, ops in paths.items() for scope in scopes if "{scope}" in t]
    templates += [(t, ops) for t, ops in paths.items() if "{scope}" not in t]
    for template, operations in templates:
        for method in (m.upper() for m in operations):
            path = template.format(**names)
            if template.endswith("/spaces/{name}") or "/spaces/{name}/" in template:
                path = path.replace("/spaces/train", "/spaces/nb")
            if template == "/api/v1/users/{name}":
                path = "/api/v1/users/alice"
            body = next((b for suffix, b in BODIES.items() if template.endswith(suffix)), None)
            for user in ("bob", "dave"):
                answer = app.http.request(method, path, json=body, headers=app.as_(user))
                where = (user, method, path, answer.status_code, answer.text[:200])
                assert answer.status_code < 500, where
                if not 200 <= answer.status_code < 300:
                    refused += answer.status_code in (403, 404)
                    continue
                assert (method, template) in SELF_SERVICE or method == "GET", where
                if method == "GET" and "{" in template:
                    member_read = user == "bob" and (
                        any(template.startswith(p) for p in MEMBER_READS) or template in MEMBER_LISTS
                    )
                    assert member_read, where
    assert refused > 40, "too few requests reached an authorization decision to prove anything"
    assert app.http.get("/api/v1/whoami", headers=app.as_("alice")).status_code == 200, "alice's token survives"
    assert app.http.get(f"/api/v1/jobs/{job['id']}", headers=app.as_("alice")).json()["status"] != "STOPPED"
