"""History in-process (fake backend and its in-memory Ray job API): a finished attempt's log is archived as it
ends, a running one's before the cluster's nodes stop, and both are read after the cluster is deleted; the jobs of
a deleted cluster are listed; its events and last view are kept; retention prunes old clusters.
Real Ray is in tests/e2e/test_history.py."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from raypod.controlplane.history import History
from tests.server.conftest import wait_ready

DEMO = {"name": "demo", "worker_groups": [{"name": "cpu", "replicas": 1}]}
PATH = "/api/v1/namespaces/default/clusters/demo"


def eventually(check: Callable[[], Any], what: str, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return found


def test_logs_outlive_the_cluster(client: TestClient, admin: dict[str, str], tmp_path: Path) -> None:
    uid = client.post("/api/v1/clusters", json=DEMO, headers=admin).json()["uid"]
    wait_ready(client, admin, "default", "demo")
    done = client.post(f"{PATH}/jobs", json={"entrypoint": "python done.py"}, headers=admin).json()["id"]
    running = client.post(f"{PATH}/jobs", json={"entrypoint": "python run.py"}, headers=admin).json()["id"]

    def submission(job: str) -> str:
        attempts = client.get(f"/api/v1/jobs/{job}", headers=admin).json()["attempts"]
        return str(attempts[-1]["submission_id"]) if attempts else ""

    first = eventually(lambda: submission(done), "the first job submitted")
    second = eventually(lambda: submission(running), "the second job submitted")
    backend = client.app.state.control_plane.backend  # type: ignore[attr-defined]
    backend.ray_jobs[uid][first]["status"] = "SUCCEEDED"
    eventually(
        lambda: client.get(f"/api/v1/jobs/{done}", headers=admin).json()["status"] == "SUCCEEDED", "the job's end"
    )
    archive = tmp_path / "history" / "default" / "demo" / uid
    assert (archive / "jobs" / done / "1.log").read_text() == f"logs of {first}\n"  # as it ended
    assert not (archive / "jobs" / running).exists()
    summary = client.get(f"/api/v1/jobs/{done}/summary", headers=admin).json()
    assert summary["tasks"]["kind"] == "tasks" and summary["actors"]["kind"] == "actors"
    assert summary["failed_tasks"] == []
    assert client.get(f"/api/v1/jobs/{running}/summary", headers=admin).status_code == 404  # not ended yet

    client.delete(PATH, headers=admin).raise_for_status()
    eventually(lambda: client.get(PATH, headers=admin).status_code == 404, "the cluster gone")
    assert client.get(f"/api/v1/jobs/{done}/logs", headers=admin).json()["logs"] == f"logs of {first}\n"
    # the running one's, as it was before the nodes stopped
    assert client.get(f"/api/v1/jobs/{running}/logs", headers=admin).json()["logs"] == f"logs of {second}\n"
    listed = [job["id"] for job in client.get("/api/v1/jobs", headers=admin).json()]
    assert listed == [done, running]
    kept = json.loads((archive / "cluster.json").read_text())
    assert kept["view"]["uid"] == uid and sorted(kept["jobs"]) == sorted([done, running])
    assert "DeletionRequested" in [event["reason"] for event in kept["events"]]
    events = client.get(f"{PATH}/events", headers=admin).json()
    assert "Archived" in [event["reason"] for event in events]

    # the deleted cluster itself, read-only: its last nodes, its events, its jobs; in the API and the console
    record = client.get(f"{PATH}/history", headers=admin).json()
    assert record["cluster"]["uid"] == uid and [job["id"] for job in record["jobs"]] == [done, running]
    assert [node["name"] for node in record["cluster"]["status"]["nodes"]] == ["head", "cpu-0"]
    assert "DeletionRequested" in [event["reason"] for event in record["events"]]
    page = client.get("/namespaces/default/clusters/demo", headers=admin)
    assert page.status_code == 200 and 'data-testid="deleted-cluster"' in page.text, page.text[:500]
    assert done in page.text and "cpu-0" in page.text and "from history" in page.text
    assert client.get("/namespaces/default/clusters/nothing", headers=admin).status_code == 404
    from tests.server.conftest import make_user

    outsider = make_user(client, admin, "eve", "other")
    hidden = client.get(f"{PATH}/history", headers=outsider)
    assert hidden.status_code == 404 and "demo" in hidden.json()["message"]


def test_a_job_of_a_deleted_cluster_without_an_archive_says_why(client: TestClient, admin: dict[str, str]) -> None:
    client.post("/api/v1/clusters", json=DEMO, headers=admin).raise_for_status()
    wait_ready(client, admin, "default", "demo")
    job = client.post(f"{PATH}/jobs", json={"entrypoint": "python x.py"}, headers=admin).json()["id"]
    eventually(lambda: client.get(f"/api/v1/jobs/{job}", headers=admin).json()["attempts"], "the job submitted")
    client.app.state.control_plane.jobs.history = None  # type: ignore[attr-defined]
    client.delete(PATH, headers=admin).raise_for_status()
    eventually(lambda: client.get(PATH, headers=admin).status_code == 404, "the cluster gone")
    answer = client.get(f"/api/v1/jobs/{job}/logs", headers=admin)
    assert answer.status_code == 404 and "was not archived" in answer.json()["message"]


def test_only_the_callers_namespaces_are_listed(client: TestClient, admin: dict[str, str]) -> None:
    from tests.server.conftest import make_user

    alice = make_user(client, admin, "alice", "ml")
    client.post("/api/v1/clusters", json=DEMO, headers=admin).raise_for_status()
    wait_ready(client, admin, "default", "demo")
    client.post(f"{PATH}/jobs", json={"entrypoint": "python x.py"}, headers=admin).raise_for_status()
    assert client.get("/api/v1/jobs", headers=alice).json() == []
    assert client.get("/api/v1/jobs", params={"namespace": "default"}, headers=alice).status_code == 403
    assert len(client.get("/api/v1/jobs", headers=admin).json()) == 1


def test_retention_prunes_clusters_deleted_long_ago(tmp_path: Path) -> None:
    history = History(str(tmp_path / "h"), retention_days=1)
    for uid, archived_at in (("old", "2000-01-01T00:00:00+00:00"), ("new", "2999-01-01T00:00:00+00:00")):
        folder = tmp_path / "h" / "default" / "demo" / uid
        folder.mkdir(parents=True)
        (folder / "cluster.json").write_text(json.dumps({"archived_at": archived_at}))
    assert history.prune(every_s=0) == 1
    assert sorted(p.name for p in (tmp_path / "h" / "default" / "demo").iterdir()) == ["new"]


def test_an_attempts_archived_log_keeps_its_start_and_its_end_within_the_limit(tmp_path: Path) -> None:
    """A job decides how much it prints; the archive (a tenant's disk or bucket) keeps a bounded part of it."""
    from datetime import UTC, datetime

    from raypod import spec as spec_mod
    from raypod import state

    history = History(str(tmp_path / "h"), max_log_bytes=8192)
    job = state.JobView(
        id="rj-1",
        namespace="default",
        cluster="demo",
        owner="admin",
        spec=spec_mod.JobSpec(entrypoint="python loud.py"),
        status=state.JobStatus.FAILED,
        attempts=[],
        created_at=datetime.now(UTC),
    )
    loud = "".join(f"line {i}\n" for i in range(100_000)) + "Traceback: the real error\n"
    history.save_attempt("u1", job, 1, loud)
    kept = history.attempt_logs(job, 1)
    assert kept is not None and len(kept.encode()) <= 8192 + 200
    assert kept.startswith("line 0\n") and kept.endswith("Traceback: the real error\n")
    assert f"{len(loud) - 8192} bytes of this log were not archived" in kept
    history.save_attempt("u1", job, 2, "short\n")
    assert history.attempt_logs(job, 2) == "short\n"
