"""The CLI in-process: Typer's CliRunner, with the SDK talking to the app through FastAPI's TestClient."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import yaml
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from raypod import config
from raypod.backends.fake import FakeBackend
from raypod.cli import clusters
from raypod.cli.main import app
from raypod.client import Client
from raypod.server.app import create_app
from raypod.testing import free_port

runner = CliRunner()


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
def server(tmp_path: Path, backend: FakeBackend, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    settings = config.Settings(home=tmp_path, reconcile_interval_s=0.05, tls=False)
    monkeypatch.setenv("RAYPOD_HOME", str(tmp_path))
    with TestClient(create_app(settings, backend=backend)) as http:
        monkeypatch.setattr(clusters, "client", lambda: Client("http://testserver", http=http))
        yield http


def test_dry_run_prints_a_raycluster_and_needs_no_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAYPOD_SERVER", "http://127.0.0.1:9")
    result = runner.invoke(
        app, ["cluster", "create", "demo", "--workers", "3", "--worker-cpus", "2", "--dry-run", "-o", "yaml"]
    )
    assert result.exit_code == 0, result.output
    manifest = yaml.safe_load(result.stdout)
    assert manifest["kind"] == "RayCluster"
    group = manifest["spec"]["workerGroupSpecs"][0]
    assert (group["groupName"], group["replicas"], group["rayStartParams"]["num-cpus"]) == ("workers", 3, "2")


def test_spec_file_and_shortcuts_combine(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text("name: ignored\nenv: {A: '1'}\nworker_groups: [{name: workers, replicas: 1, cpus: 2}]\n")
    result = runner.invoke(
        app, ["cluster", "create", "demo", "-f", str(path), "--workers", "4", "--dry-run", "-o", "json"]
    )
    assert result.exit_code == 0, result.output
    manifest = json.loads(result.stdout)
    assert manifest["metadata"]["name"] == "demo"
    group = manifest["spec"]["workerGroupSpecs"][0]
    assert (group["replicas"], group["rayStartParams"]["num-cpus"]) == (4, "2")


def test_create_list_get_scale_events_delete(server: TestClient, backend: FakeBackend) -> None:
    result = runner.invoke(app, ["cluster", "create", "demo", "--workers", "2", "-o", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["status"]["phase"] == "Ready"

    listed = runner.invoke(app, ["cluster", "list", "-o", "json"])
    assert [v["spec"]["name"] for v in json.loads(listed.stdout)] == ["demo"]
    table = runner.invoke(app, ["cluster", "list"])
    assert "demo" in table.stdout and "Ready" in table.stdout

    scaled = runner.invoke(app, ["cluster", "scale", "demo", "3", "-o", "yaml"])
    assert scaled.exit_code == 0, scaled.output
    assert len(yaml.safe_load(scaled.stdout)["status"]["nodes"]) == 4

    events = runner.invoke(app, ["cluster", "events", "demo", "-o", "json"])
    assert "Scaled" in [e["reason"] for e in json.loads(events.stdout)]

    shown = runner.invoke(app, ["cluster", "get", "demo"])
    assert "HEALTH" in shown.stdout and "NodesHealthy" in shown.stdout
    for verb in ("cordon", "uncordon", "replace"):
        done = runner.invoke(app, ["node", verb, "demo", "workers-0"])
        assert done.exit_code == 0 and "workers-0" in done.stdout, done.output
    unknown = runner.invoke(app, ["node", "replace", "demo", "workers-9"])
    assert unknown.exit_code == 1 and "node 'workers-9' not in cluster 'demo'" in unknown.output
    reasons = [e["reason"] for e in json.loads(runner.invoke(app, ["cluster", "events", "demo", "-o", "json"]).stdout)]
    assert {"NodeCordoned", "NodeUncordoned", "NodeReplaceRequested"} <= set(reasons)

    deleted = runner.invoke(app, ["cluster", "delete", "demo"])
    assert deleted.exit_code == 0 and "deleted" in deleted.stdout
    assert backend.nodes == {}


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["cluster", "create", "Bad_Name", "--dry-run"], "cluster name 'Bad_Name'"),
        (["cluster", "create", "demo", "--workers", "-1", "--dry-run"], "replicas"),
        (["cluster", "create", "demo", "-f", "/nonexistent.yaml", "--dry-run"], "cannot read spec file"),
        (["cluster", "get", "nope"], "cluster 'nope' not found"),
        (["cluster", "scale", "nope", "2"], "not found"),
        (["cluster", "delete", "nope"], "not found"),
        (["cluster", "events", "nope"], "not found"),
    ],
)
def test_bad_input_is_one_line_and_exit_1(server: TestClient, args: list[str], fragment: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 1
    assert fragment in result.stderr
    assert "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1


def test_unreachable_server_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAYPOD_SERVER", "http://127.0.0.1:9")
    result = runner.invoke(app, ["cluster", "list"])
    assert result.exit_code == 1
    assert "cannot reach the raypod server at http://127.0.0.1:9" in result.stderr


def test_monitoring_up_without_prometheus_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAYPOD_PROMETHEUS_BIN", "/nonexistent/prometheus")
    result = runner.invoke(app, ["monitoring", "up"])
    assert result.exit_code == 1
    assert "Prometheus is not installed" in result.output and "apt-get install prometheus" in result.output


def test_job_commands_make_one_sdk_call_each(server: TestClient, backend: FakeBackend) -> None:
    assert runner.invoke(app, ["cluster", "create", "demo", "--workers", "1"]).exit_code == 0
    submitted = runner.invoke(app, ["job", "submit", "-c", "demo", "--no-wait", "-o", "json", "--", "python", "x.py"])
    assert submitted.exit_code == 0, submitted.output
    job = json.loads(submitted.stdout)
    assert job["spec"]["entrypoint"] == "python x.py" and job["submitted_via"] == "raypod"
    listed = runner.invoke(app, ["job", "list", "-c", "demo"])
    assert job["id"] in listed.stdout and "via=raypod" in listed.stdout
    deadline = time.monotonic() + 10  # the job supervisor submits it
    while not json.loads(runner.invoke(app, ["job", "get", job["id"], "-o", "json"]).stdout)["attempts"]:
        assert time.monotonic() < deadline, "the job was never submitted to Ray"
        time.sleep(0.05)
    logs = runner.invoke(app, ["job", "logs", job["id"]])
    assert logs.stdout == f"logs of {job['id']}-1\n"
    stopped = runner.invoke(app, ["job", "stop", job["id"]])
    assert stopped.exit_code == 0 and "stop requested" in stopped.stdout
    bad = runner.invoke(app, ["job", "get", "not-a-job"])
    assert bad.exit_code == 1 and "not a job id" in bad.stderr


def test_token_user_team_namespace_commands(server: TestClient) -> None:
    assert runner.invoke(app, ["team", "create", "ml"]).exit_code == 0
    assert runner.invoke(app, ["namespace", "create", "ml", "--team", "ml"]).exit_code == 0
    user = runner.invoke(app, ["user", "create", "bob", "--team", "ml", "-o", "json"])
    assert json.loads(user.stdout)["teams"] == {"ml": "member"}
    promoted = runner.invoke(app, ["team", "add-member", "ml", "bob", "--role", "admin"])
    assert "bob is now admin of team ml" in promoted.stdout
    created = runner.invoke(app, ["token", "create", "--user", "bob", "--expires-in-days", "1", "-o", "json"])
    token = json.loads(created.stdout)
    assert token["token"].startswith("rpt_")
    listed = json.loads(runner.invoke(app, ["token", "list", "-o", "json"]).stdout)
    assert token["id"] in [t["id"] for t in listed]
    revoked = runner.invoke(app, ["token", "revoke", token["id"]])
    assert revoked.exit_code == 0 and f"token {token['id']} revoked" in revoked.stdout
    assert "ml" in runner.invoke(app, ["namespace", "list"]).stdout
    deleted = runner.invoke(app, ["user", "delete", "bob"])
    assert deleted.exit_code == 0 and "user bob deleted" in deleted.stdout
    assert "bob" not in runner.invoke(app, ["user", "list"]).stdout


@pytest.mark.skipif(
    shutil.which("prometheus") is None and not os.environ.get("RAYPOD_REQUIRE_PROMETHEUS"),
    reason="Prometheus is not installed (apt-get install prometheus)",
)
# `monitoring up` leaves Prometheus running on purpose; in-process, Popen's destructor warns about that.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_down_also_stops_the_prometheus_of_monitoring_up(server: TestClient, tmp_path: Path) -> None:
    from raypod.capabilities.observability import local_prometheus

    port = free_port()
    up = runner.invoke(app, ["monitoring", "up", "--port", str(port)])
    assert up.exit_code == 0, up.output
    running = local_prometheus.read(tmp_path)
    assert running is not None and psutil.pid_exists(running.pid)
    token_id = running.token_id
    down = runner.invoke(app, ["down", "--keep-clusters"])
    assert down.exit_code == 0, down.output
    assert "Prometheus stopped" in down.stdout and "its token is revoked" in down.stdout
    assert not psutil.pid_exists(running.pid) or psutil.Process(running.pid).status() == psutil.STATUS_ZOMBIE
    assert local_prometheus.read(tmp_path) is None
    tokens = json.loads(runner.invoke(app, ["token", "list", "-o", "json"]).stdout)
    assert next(t for t in tokens if t["id"] == token_id)["revoked_at"] is not None


def test_down_keep_monitoring_leaves_it_alone(server: TestClient) -> None:
    down = runner.invoke(app, ["down", "--keep-clusters", "--keep-monitoring"])
    assert down.exit_code == 0 and "Prometheus" not in down.stdout


def test_quota_and_queue_commands(server: TestClient) -> None:
    assert runner.invoke(app, ["team", "create", "ml"]).exit_code == 0
    set_ = runner.invoke(app, ["quota", "set", "ml", "--cpus", "8", "--memory", "16Gi", "--borrow"])
    assert set_.exit_code == 0, set_.output
    assert "ml" in set_.stdout and "0/8" in set_.stdout and "queue +borrow" in set_.stdout
    shown = json.loads(runner.invoke(app, ["quota", "get", "ml", "-o", "json"]).stdout)
    assert shown["quota"]["cpus"] == 8 and shown["quota"]["borrow"] is True
    assert [q["team"] for q in json.loads(runner.invoke(app, ["quota", "list", "-o", "json"]).stdout)] == ["ml"]
    bad = runner.invoke(app, ["quota", "set", "ml", "--cpus", "-2"])
    assert bad.exit_code == 1 and "cpus" in bad.output and "Traceback" not in bad.output
    assert "Nothing waits." in runner.invoke(app, ["queue", "list"]).stdout
    assert runner.invoke(app, ["namespace", "create", "ml-dev", "--team", "ml"]).exit_code == 0
    capped = runner.invoke(app, ["quota", "set", "--namespace", "ml-dev", "--cpus", "2"])
    assert capped.exit_code == 0 and "ml (namespace ml-dev)" in capped.stdout and "0/2" in capped.stdout
    both = runner.invoke(app, ["quota", "get", "ml", "--namespace", "ml-dev"])
    assert both.exit_code == 1 and "not both" in both.output
    assert runner.invoke(app, ["quota", "delete", "--namespace", "ml-dev"]).exit_code == 0
    assert runner.invoke(app, ["quota", "delete", "ml"]).exit_code == 0
    assert runner.invoke(app, ["quota", "list", "-o", "json"]).stdout.strip() == "[]"
