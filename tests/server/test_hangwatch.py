"""The control plane's side of hang detection, in-process with the fake backend: directories a test fills as
the nodes' agents would (status and detection files; no agent or Ray runs here, the e2e tests run them)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from raypod.capabilities.hangwatch import layout
from tests.server.conftest import make_user, wait_ready

RUN, ATTEMPT = "f" * 32, "a" * 16


def status(rank: int, stalled: float | None, *, action: str = "notify", job: str | None = None) -> dict[str, Any]:
    now = time.time()
    return {
        "agent_pid": 1,
        "time": now,
        "poll_s": 0.2,
        "runs": [
            {
                "run_id": RUN,
                "run": "demo",
                "attempt": ATTEMPT,
                "job_id": "02000000",
                "raypod_job": job,
                "world_size": 2,
                "enabled": True,
                "action": action,
                "max_hang_restarts": 0,
                "ranks": [
                    {
                        "rank": rank,
                        "node": f"cpu-{rank}",
                        "pid": 10 + rank,
                        "reports": 4,
                        "last_report": now - 60,
                        "stalled_s": stalled,
                        "timeout_s": 20.0,
                        "last_progress": now - (stalled or 0),
                        "paused": None if stalled else "checkpoint",
                    }
                ],
            }
        ],
    }


def detection(rank: int, action: str, job: str | None) -> dict[str, Any]:
    now = time.time()
    return {
        "id": f"x-{rank}",
        "run_id": RUN,
        "run": "demo",
        "attempt": ATTEMPT,
        "job_id": "02000000",
        "raypod_job": job,
        "kind": "hang",
        "reason": "no progress from any of the 2 ranks for 21 s",
        "timeout_s": 20.0,
        "last_progress": now - 21,
        "detected_at": now,
        "action": action,
        "hangs_without_progress": 1,
        "diagnostics_s": 0.2,
        "stalled_first": [rank],
        "ranks": [
            {
                "rank": rank,
                "node": f"cpu-{rank}",
                "pid": 10 + rank,
                "reports": 4,
                "last_report": now - 21,
                "stalled_s": 21.0,
                "waiting_in": "all_reduce (torch/distributed/distributed_c10d.py:3252)",
                "stack": "Thread 1 (idle)\n    all_reduce (c10d.py:1)\n",
                "log_tail": ["step 3"],
            }
        ],
    }


def setup_cluster(client: TestClient, admin: dict[str, str], tmp_path: Path) -> tuple[str, dict[str, Path]]:
    client.post("/api/v1/clusters", json={"name": "hw"}, headers=admin).raise_for_status()
    wait_ready(client, admin, "default", "hw")
    uid = client.get("/api/v1/namespaces/default/clusters/hw", headers=admin).json()["uid"]
    roots = {"cpu-0": tmp_path / "n0", "cpu-1": tmp_path / "n1"}  # the nodes' add-on directories
    client.app.state.clusters.backend.addon_roots[uid] = roots  # type: ignore[attr-defined]
    return uid, {node: root / "hangwatch" for node, root in roots.items()}


def wait_for(check: Any, what: str, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_hang_seen_on_every_node_is_requested_once_and_the_detections_merge_into_one(
    client: TestClient, admin: dict[str, str], tmp_path: Path
) -> None:
    _, dirs = setup_cluster(client, admin, tmp_path)
    # Rank 1's first: a collector pass between the two writes must not see rank 0 stalled and rank 1 unknown.
    layout.write_json(dirs["cpu-1"] / "status.json", status(1, None))  # rank 1 saves a checkpoint
    layout.write_json(dirs["cpu-0"] / "status.json", status(0, 25.0))
    time.sleep(0.5)
    assert not list(dirs["cpu-0"].glob("requests/*.json")), "a paused rank elsewhere is not a hang"
    layout.write_json(dirs["cpu-1"] / "status.json", status(1, 22.0))
    requests = wait_for(lambda: list(dirs["cpu-0"].glob("requests/*.json")), "a request")
    [made] = requests
    request = layout.read_json(made)
    assert request is not None and request["action"] == "notify" and request["ranks"][0] == 0
    # The collector hands it to each node in turn: wait for the second, not just the first.
    wait_for(lambda: (dirs["cpu-1"] / "requests" / made.name).exists(), "the request on the other node too")
    training = client.get("/api/v1/namespaces/default/clusters/hw/training", headers=admin).json()
    assert training[0]["hung"] and [r["rank"] for r in training[0]["ranks"]] == [0, 1]
    for rank, node in enumerate(dirs):
        layout.write_json(layout.detections_dir(dirs[node]) / f"d{rank}.json", detection(rank, "notify", None))
    found = wait_for(
        lambda: [
            d
            for d in client.get("/api/v1/namespaces/default/clusters/hw/hangs", headers=admin).json()
            if len(d["ranks"]) == 2
        ],
        "the merged detection",
    )
    assert len(found) == 1 and found[0]["common_wait"] == "all_reduce"
    events = client.get("/api/v1/namespaces/default/clusters/hw/events", headers=admin).json()
    assert [e["reason"] for e in events].count("JobHangDetected") == 1
    metrics = client.get("/metrics", headers=admin).text
    assert 'raypod_hung_jobs{namespace="default",ray_io_cluster="hw"} 1.0' in metrics
    assert "raypod_hang_detect_seconds_count" in metrics


def test_a_run_that_hangs_again_and_again_fails_its_job_with_the_reason(
    client: TestClient, admin: dict[str, str], tmp_path: Path
) -> None:
    """The control plane decides to fail the job (its own count of hangs in a row, past ``max_hang_restarts``),
    and finds the job in its own records of the cluster from the Ray job id: no file names the job or the
    action (tests/security/test_tenant_boundary.py)."""
    uid, dirs = setup_cluster(client, admin, tmp_path)
    job = client.post(
        "/api/v1/namespaces/default/clusters/hw/jobs", json={"entrypoint": "python train.py"}, headers=admin
    ).json()
    backend = client.app.state.clusters.backend  # type: ignore[attr-defined]
    wait_for(lambda: backend.ray_jobs.get(uid), "the submission on Ray")
    [submitted] = backend.ray_jobs[uid].values()
    submitted["job_id"] = "02000000"
    layout.write_json(dirs["cpu-0"] / "status.json", status(0, 25.0, action="cancel"))
    layout.write_json(dirs["cpu-1"] / "status.json", status(1, 22.0, action="cancel"))
    failed = wait_for(
        lambda: (j := client.get(f"/api/v1/jobs/{job['id']}", headers=admin).json())["status"] == "FAILED" and j,
        "the job failed",
    )
    assert "hung 1 times with no progress" in failed["attempts"][-1]["message"]
    [request] = list(dirs["cpu-0"].glob("requests/*.json"))
    assert (layout.read_json(request) or {})["action"] == "fail-job"
    layout.write_json(layout.detections_dir(dirs["cpu-0"]) / "d.json", detection(0, "cancel", None))
    listed = wait_for(
        lambda: client.get(f"/api/v1/namespaces/default/clusters/hw/hangs?job={job['id']}", headers=admin).json(),
        "the detection, with its job from raypod's records",
    )
    assert [d["action"] for d in listed] == ["fail-job"]


def test_hangs_are_visible_only_to_who_may_see_the_cluster_and_bad_queries_are_refused(
    client: TestClient, admin: dict[str, str], tmp_path: Path
) -> None:
    setup_cluster(client, admin, tmp_path)
    outsider = make_user(client, admin, "eve", "other")
    assert client.get("/api/v1/namespaces/default/clusters/hw/hangs", headers=outsider).status_code == 403
    assert client.get("/api/v1/namespaces/default/clusters/hw/hangs").status_code == 401
    assert client.get("/api/v1/namespaces/default/clusters/hw/hangs?job=nope", headers=admin).status_code == 422
    assert client.get("/api/v1/namespaces/default/clusters/none/training", headers=admin).status_code == 404
