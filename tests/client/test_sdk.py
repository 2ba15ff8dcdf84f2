"""The SDK covers every noun, with typed models shared with the server (in-process app, fake backend)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from raypod import config, errors, state
from raypod import spec as spec_mod
from raypod.backends.fake import FakeBackend
from raypod.client import Client
from raypod.controlplane.jobs import supervisor


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
def sdk(tmp_path: Path, backend: FakeBackend) -> Iterator[Client]:
    settings = config.Settings(home=tmp_path, reconcile_interval_s=0.05, tls=False)
    from raypod.server.app import create_app

    with TestClient(create_app(settings, backend=backend)) as http:
        token = json.loads((tmp_path / "credentials").read_text())["token"]
        yield Client("http://testserver", http=http, token=token)


def ready_cluster(sdk: Client) -> state.ClusterView:
    sdk.clusters.create({"name": "demo", "worker_groups": [{"name": "cpu", "replicas": 1}]})
    return sdk.clusters.wait_ready("demo", timeout=10)


def submitted(sdk: Client, job_id: str) -> state.JobView:
    """The job once the supervisor has submitted its first attempt."""
    deadline = time.monotonic() + 10
    while not (job := sdk.jobs.get(job_id)).attempts:
        assert time.monotonic() < deadline, "the job was never submitted to Ray"
        time.sleep(0.05)
    return job


def test_jobs_submit_list_get_logs_stop(sdk: Client, backend: FakeBackend) -> None:
    ready_cluster(sdk)
    job = sdk.jobs.submit("demo", spec_mod.JobSpec(entrypoint="python train.py", max_retries=1))
    assert isinstance(job, state.JobView) and job.owner == "admin"
    assert job.submitted_via is state.SubmittedVia.RAYPOD
    assert [j.id for j in sdk.jobs.list("demo")] == [job.id]
    assert submitted(sdk, job.id).spec.entrypoint == "python train.py"
    assert sdk.jobs.logs(job.id) == f"logs of {job.id}-1\n"
    stopped = sdk.jobs.stop(job.id)
    assert stopped.stop_requested
    assert sdk.jobs.wait(job.id, timeout=10).status is state.JobStatus.STOPPED
    with pytest.raises(errors.InvalidSpec, match="not a job id"):
        sdk.jobs.get("../../tokens")
    with pytest.raises(errors.NotFound):
        sdk.jobs.get("rj-0000000000")


def test_an_attempt_ray_lost_with_its_head_is_failed_and_retried(sdk: Client, backend: FakeBackend) -> None:
    view = ready_cluster(sdk)
    job = sdk.jobs.submit("demo", spec_mod.JobSpec(entrypoint="python train.py", max_retries=1, backoff_s=0))
    submitted(sdk, job.id)
    # The head is replaced without GCS fault tolerance: the new head's Ray has never heard of the submission.
    backend.ray_jobs[view.uid].clear()
    for _ in range(200):
        current = sdk.jobs.get(job.id)
        if len(current.attempts) == 2:
            break
        time.sleep(0.05)
    assert len(current.attempts) == 2, current
    assert current.attempts[0].status == "FAILED" and "head was replaced" in current.attempts[0].message
    assert current.status in (state.JobStatus.RUNNING, state.JobStatus.PENDING)


def test_working_dir_upload_returns_a_ray_package_uri(sdk: Client) -> None:
    ready_cluster(sdk)
    uri = sdk.jobs.upload_working_dir("demo", [("proj/train.py", b"print(1)\n"), ("proj/data/x.txt", b"x")])
    assert uri.startswith("gcs://_ray_pkg_") and uri.endswith(".zip")
    with pytest.raises(errors.InvalidSpec, match="unsafe file path"):
        sdk.jobs.upload_working_dir("demo", [("../escape.py", b"")])


def test_jobs_of_plain_ray_tooling_are_listed_marked_and_followed(sdk: Client, backend: FakeBackend) -> None:
    view = ready_cluster(sdk)
    backend.ray_submit(view.uid, "raysubmit_abc", "python plain.py", start_time=1_700_000_000_000)
    # The server's supervisor imports them on its own timer (every few seconds).
    found: list[state.JobView] = []
    for _ in range(200):
        found = [j for j in sdk.jobs.list("demo") if j.submitted_via is state.SubmittedVia.RAY]
        if found:
            break
        time.sleep(0.05)
    assert len(found) == 1
    job = found[0]
    assert job.id == supervisor.imported_id(view.uid, "raysubmit_abc")
    assert job.spec.entrypoint == "python plain.py" and job.owner == ""
    assert sdk.jobs.logs(job.id) == "logs of raysubmit_abc\n"
    # Plain-Ray users know it by Ray's id: the SDK (and so the CLI) takes it wherever it takes raypod's.
    assert sdk.jobs.get("raysubmit_abc").id == job.id
    assert sdk.jobs.logs("raysubmit_abc") == "logs of raysubmit_abc\n"
    backend.finish_job(view.uid, "raysubmit_abc", "SUCCEEDED")
    assert sdk.jobs.wait(job.id, timeout=10).status is state.JobStatus.SUCCEEDED
    assert len(sdk.jobs.list("demo")) == 1, "imported twice"


def test_identities_through_the_sdk(sdk: Client) -> None:
    assert sdk.users.whoami().is_admin
    assert sdk.teams.create("ml") == state.TeamInfo(name="ml")
    assert sdk.namespaces.create("ml", "ml") == state.NamespaceInfo(name="ml", team="ml")
    alice = sdk.users.create("alice", team="ml")
    assert alice.teams == {"ml": state.Role.MEMBER}
    promoted = sdk.teams.add_member("ml", "alice", state.Role.ADMIN)
    assert promoted.teams == {"ml": state.Role.ADMIN}
    assert "alice" in [u.name for u in sdk.users.list()]
    assert "ml" in [n.name for n in sdk.namespaces.list()]
    created = sdk.tokens.create("ci", ttl_seconds=3600, user="alice")
    assert created.token.startswith("rpt_") and created.user == "alice"
    assert created.id in [t.id for t in sdk.tokens.list()]
    assert sdk.tokens.revoke(created.id).revoked_at is not None
    with pytest.raises(errors.InvalidSpec):
        sdk.tokens.revoke("../users")


def test_monitoring_through_the_sdk(sdk: Client) -> None:
    ready_cluster(sdk)
    targets = sdk.monitoring.targets()
    assert {t["labels"]["ray_io_cluster"] for t in targets} == {"demo"}
    assert "raypod_clusters" in sdk.monitoring.metrics()
    with pytest.raises(errors.Conflict):
        sdk.monitoring.charts("demo")  # no Prometheus runs: the console says what to run
