"""The API in-process: create_app with the fake backend behind FastAPI's TestClient (no sockets, no Ray)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from raypod import config
from raypod.backends import base
from raypod.backends.fake import FakeBackend
from raypod.server.app import create_app
from tests.server.conftest import wait_ready

CLUSTER = {"name": "demo", "worker_groups": [{"name": "cpu", "replicas": 2}]}


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend(
        capacity=base.HostCapacity(
            cpus_per_node=2,
            memory_bytes=16 * 2**30,
            shared_memory_bytes=8 * 2**30,
            gpus_per_node=0,
            head_overhead_bytes=2**30,
            worker_overhead_bytes=2**28,
        )
    )


@pytest.fixture
def api(tmp_path: Path, backend: FakeBackend) -> Iterator[TestClient]:
    settings = config.Settings(home=tmp_path, reconcile_interval_s=0.05, tls=False)
    with TestClient(create_app(settings, backend=backend), raise_server_exceptions=False) as client:
        token = json.loads((tmp_path / "credentials").read_text())["token"]
        client.headers["Authorization"] = f"Bearer {token}"
        yield client


def wait_for(api: TestClient, path: str, predicate: Any, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        response = api.get(path)
        if predicate(response):
            return response
        time.sleep(0.05)
    raise AssertionError(f"condition on {path} not met: {response.status_code} {response.text[:300]}")


def ready(response: Any) -> bool:
    return response.status_code == 200 and response.json()["status"]["phase"] == "Ready"


PATH = "/api/v1/namespaces/default/clusters/demo"


def test_create_scale_delete_through_the_api(api: TestClient, backend: FakeBackend) -> None:
    created = api.post("/api/v1/clusters", json=CLUSTER)
    assert created.status_code == 202, created.text
    view = wait_for(api, PATH, ready).json()
    assert [n["name"] for n in view["status"]["nodes"]] == ["head", "cpu-0", "cpu-1"]

    assert api.post(f"{PATH}/scale", json={"group": "cpu", "replicas": 1}).status_code == 202
    view = wait_for(api, PATH, lambda r: ready(r) and len(r.json()["status"]["nodes"]) == 2).json()
    assert ("drain", view["uid"], "cpu-1") in backend.calls

    assert api.delete(PATH).status_code == 202
    wait_for(api, PATH, lambda r: r.status_code == 404)
    assert ("release", view["uid"], "") in backend.calls
    reasons = [e["reason"] for e in api.get(f"{PATH}/events").json()]
    for expected in ("Created", "CreatedHead", "CreatedWorker", "Scaled", "DrainedNode", "DeletionRequested"):
        assert expected in reasons


def test_dead_node_is_replaced_and_recorded(api: TestClient, backend: FakeBackend) -> None:
    uid = api.post("/api/v1/clusters", json=CLUSTER).json()["uid"]
    wait_for(api, PATH, ready)
    backend.kill(uid, "cpu-0")
    wait_for(api, f"{PATH}/events", lambda r: "ReplacedNode" in [e["reason"] for e in r.json()])
    wait_for(api, PATH, ready)
    reasons = [e["reason"] for e in api.get(f"{PATH}/events").json()]
    assert reasons.index("RemovedDeadNode") < reasons.index("ReplacedNode")


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        ({"name": "Bad_Name"}, 422, "name"),
        ({"name": "demo", "worker_groups": [{"name": "cpu", "replicas": -3}]}, 422, "replicas"),
        ({"name": "demo", "worker_groups": [{"name": "cpu", "replicas": 1_000_000}]}, 422, "replicas"),
        ({"name": "demo", "worker_groups": [{"name": "cpu", "replicas": 500}]}, 422, "needs"),
        ({"name": "demo", "worker_groups": [{"name": "cpu", "cpus": 64}]}, 422, "64 CPUs"),
        ({"name": "demo", "worker_groups": [{"name": "cpu", "gpus": 1}]}, 422, "GPUs"),
        ({"name": "demo", "head": {"memory": "100Ti"}}, 422, "memory"),
        ({"name": "demo", "flavour": "large"}, 422, "flavour"),
        ({}, 422, "name"),
    ],
)
def test_bad_specs_get_a_clear_4xx_and_start_nothing(
    api: TestClient, backend: FakeBackend, body: dict[str, Any], status: int, fragment: str
) -> None:
    response = api.post("/api/v1/clusters", json=body)
    assert response.status_code == status
    payload = response.json()
    assert payload["code"] in ("invalid_spec", "insufficient_capacity")
    assert fragment in payload["message"]
    assert backend.calls == []
    assert api.get("/api/v1/clusters").json() == []


def test_malformed_json_is_a_client_error(api: TestClient) -> None:
    response = api.post("/api/v1/clusters", content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert response.json()["code"] == "invalid_spec"


def test_duplicates_unknown_clusters_and_groups_leave_the_running_cluster_alone(
    api: TestClient, backend: FakeBackend
) -> None:
    api.post("/api/v1/clusters", json=CLUSTER)
    before = wait_for(api, PATH, ready).json()
    calls = list(backend.calls)

    duplicate = api.post("/api/v1/clusters", json=CLUSTER)
    assert (duplicate.status_code, duplicate.json()["code"]) == (409, "already_exists")
    missing = api.get("/api/v1/namespaces/default/clusters/nope")
    assert missing.status_code == 404 and "clusters there: demo" in missing.json()["message"]
    assert api.delete("/api/v1/namespaces/default/clusters/nope").status_code == 404
    group = api.post(f"{PATH}/scale", json={"group": "gpu", "replicas": 1})
    assert group.status_code == 404 and "groups: cpu" in group.json()["message"]
    assert api.post(f"{PATH}/scale", json={"group": "cpu", "replicas": -1}).status_code == 422
    assert api.post(f"{PATH}/scale", json={"group": "cpu", "replicas": 400}).status_code == 422
    assert api.post(f"{PATH}/scale", json={"group": "cpu"}).status_code == 422
    assert api.get("/api/v1/namespaces/default/clusters/..%2Fetc").status_code in (404, 422)
    assert api.get("/api/v1/namespaces/Bad_NS/clusters/demo").status_code == 422

    time.sleep(0.3)
    after = api.get(PATH).json()
    assert backend.calls == calls
    assert after["generation"] == before["generation"]
    assert after["status"]["phase"] == "Ready"


def test_manifest_route_and_openapi(api: TestClient) -> None:
    api.post("/api/v1/clusters", json=CLUSTER)
    manifest = api.get(f"{PATH}/manifest").json()
    assert manifest["kind"] == "RayCluster" and manifest["spec"]["workerGroupSpecs"][0]["replicas"] == 2
    paths = api.get("/openapi.json").json()["paths"]
    assert "/api/v1/namespaces/{namespace}/clusters/{name}/scale" in paths
    assert api.get("/healthz").json()["status"] == "ok"


def test_unexpected_errors_become_a_500_with_a_request_id(api: TestClient, backend: FakeBackend) -> None:
    def broken() -> base.HostCapacity:
        raise RuntimeError("boom")

    backend.capacity = broken  # type: ignore[method-assign]
    response = api.post("/api/v1/clusters", json=CLUSTER)
    assert response.status_code == 500
    assert "boom" not in response.text and response.json()["detail"]["request_id"]


def test_node_verbs_reach_the_loop_and_bad_ones_get_a_clear_4xx(api: TestClient, backend: FakeBackend) -> None:
    uid = api.post("/api/v1/clusters", json=CLUSTER).json()["uid"]
    wait_for(api, PATH, ready)
    first = backend.nodes[uid]["cpu-0"].incarnation
    assert api.post(f"{PATH}/nodes/cpu-0/replace").status_code == 202
    # Between the old node's removal and the new one's start the fake has no cpu-0 (the view may still say Ready).
    wait_for(api, PATH, lambda r: ready(r) and getattr(backend.nodes[uid].get("cpu-0"), "incarnation", first) != first)
    assert api.post(f"{PATH}/nodes/cpu-1/cordon").status_code == 202
    view = wait_for(api, PATH, lambda r: any(n["cordoned"] for n in r.json()["status"]["nodes"])).json()
    assert [n["name"] for n in view["status"]["nodes"] if n["cordoned"]] == ["cpu-1"]
    assert all(n["health"] == "Healthy" for n in view["status"]["nodes"])
    assert api.post(f"{PATH}/nodes/cpu-1/uncordon").status_code == 202
    wait_for(api, PATH, lambda r: not any(n["cordoned"] for n in r.json()["status"]["nodes"]))
    reasons = [e["reason"] for e in api.get(f"{PATH}/events").json()]
    for expected in ("NodeReplaceRequested", "DrainingOnRequest", "ReplacedNode", "NodeCordoned", "NodeUncordoned"):
        assert expected in reasons
    missing = api.post(f"{PATH}/nodes/cpu-9/replace")
    assert missing.status_code == 404 and "cpu-0, cpu-1" in missing.json()["message"]
    assert api.post(f"{PATH}/nodes/cpu-0/reboot").status_code in (400, 404, 422)
    assert api.post("/api/v1/namespaces/default/clusters/nope/nodes/head/replace").status_code == 404


def test_the_cluster_list_pages_in_name_order_and_a_bad_continue_token_is_a_4xx(api: TestClient) -> None:
    for name in ["e", "a", "d", "c", "b"]:
        api.post("/api/v1/clusters", json={"name": name, "head": {"cpus": 1, "memory": "1Gi"}}).raise_for_status()
    first = api.get("/api/v1/clusters", params={"limit": 2})
    assert [c["spec"]["name"] for c in first.json()] == ["a", "b"]
    assert first.headers["x-continue"] == "default/b"
    second = api.get("/api/v1/clusters", params={"limit": 2, "continue": first.headers["x-continue"]})
    last = api.get("/api/v1/clusters", params={"limit": 2, "continue": second.headers["x-continue"]})
    assert [c["spec"]["name"] for c in second.json() + last.json()] == ["c", "d", "e"]
    assert "x-continue" not in last.headers
    assert [c["spec"]["name"] for c in api.get("/api/v1/clusters").json()] == ["a", "b", "c", "d", "e"]
    for bad in ({"limit": 0}, {"limit": 5000}, {"continue": "no-slash"}, {"continue": "../x"}):
        assert api.get("/api/v1/clusters", params=bad).status_code == 422, bad


def test_a_rayjob_on_a_backend_without_kuberay_is_a_clear_4xx(api: TestClient) -> None:
    api.post("/api/v1/clusters", json={"name": "demo", "head": {"cpus": 1, "memory": "1Gi"}}).raise_for_status()
    wait_for(api, PATH, ready)
    response = api.post(f"{PATH}/jobs", json={"entrypoint": "python x.py", "as_rayjob": True})
    assert response.status_code == 422
    assert "needs the Kubernetes backend" in response.json()["message"]


def test_the_supervisor_submits_a_stored_job_and_fails_it_with_rays_refusal(
    api: TestClient, backend: FakeBackend
) -> None:
    """A submission is stored desired state: the request answers 202 without asking Ray (which refuses every
    submission here), and the job supervisor, its one writer, submits it and records Ray's refusal."""
    api.post("/api/v1/clusters", json={"name": "demo", "head": {"cpus": 1, "memory": "1Gi"}}).raise_for_status()
    wait_for(api, PATH, ready)
    backend.refused_submission = "runtime_env: unknown field 'piip'"
    submitted = api.post(f"{PATH}/jobs", json={"entrypoint": "python x.py", "runtime_env": {"piip": ["x"]}})
    assert submitted.status_code == 202, submitted.text
    assert submitted.json()["status"] == "PENDING" and submitted.json()["attempts"] == []
    job = wait_for(api, f"/api/v1/jobs/{submitted.json()['id']}", lambda r: r.json()["status"] == "FAILED").json()
    assert [a["status"] for a in job["attempts"]] == ["FAILED"]
    assert "unknown field 'piip'" in job["attempts"][0]["message"]
    backend.refused_submission = None
    again = api.post(f"{PATH}/jobs", json={"entrypoint": "python y.py"}).json()
    running = wait_for(api, f"/api/v1/jobs/{again['id']}", lambda r: r.json()["status"] == "RUNNING").json()
    assert [a["submission_id"] for a in running["attempts"]] == [f"{again['id']}-1"]


def test_a_submission_ray_cannot_take_yet_is_tried_again(api: TestClient, backend: FakeBackend) -> None:
    """Right after a head starts, Ray's job API answers 500 "No available agent to submit job, please try again
    later" for a moment: the job stays PENDING and is submitted once Ray takes it (a CI run failed the job)."""
    api.post("/api/v1/clusters", json={"name": "demo", "head": {"cpus": 1, "memory": "1Gi"}}).raise_for_status()
    wait_for(api, PATH, ready)
    backend.refused_submission = "No available agent to submit job, please try again later"
    backend.refused_status = 500
    submitted = api.post(f"{PATH}/jobs", json={"entrypoint": "python x.py"}).json()
    time.sleep(0.5)  # a few supervisor passes (each 0.05 s) refused by Ray: the claim is what they leave
    assert api.get(f"/api/v1/jobs/{submitted['id']}").json()["status"] == "PENDING"
    backend.refused_submission = None
    running = wait_for(api, f"/api/v1/jobs/{submitted['id']}", lambda r: r.json()["status"] == "RUNNING").json()
    assert [a["submission_id"] for a in running["attempts"]] == [f"{submitted['id']}-1"]


def test_an_attempt_ray_already_has_is_followed_not_failed(api: TestClient, backend: FakeBackend) -> None:
    """The server stopped after Ray took an attempt and before the record said so: on the next pass the supervisor
    submits the same id again, Ray refuses the duplicate, and the attempt it has is recorded and followed."""
    api.post("/api/v1/clusters", json={"name": "demo", "head": {"cpus": 1, "memory": "1Gi"}}).raise_for_status()
    uid = wait_for(api, PATH, ready).json()["uid"]
    backend.refused_submission = "Job with submission_id already exists"
    jobs = api.app.state.jobs  # type: ignore[attr-defined]
    original = jobs.submit_attempt

    def taken_before_a_crash(view: Any, job: Any) -> None:
        backend.ray_submit(uid, f"{job.id}-1", job.spec.entrypoint)
        original(view, job)

    jobs.submit_attempt = taken_before_a_crash
    submitted = api.post(f"{PATH}/jobs", json={"entrypoint": "python x.py"}).json()
    running = wait_for(api, f"/api/v1/jobs/{submitted['id']}", lambda r: r.json()["status"] == "RUNNING").json()
    assert [a["submission_id"] for a in running["attempts"]] == [f"{submitted['id']}-1"]


def test_a_job_is_found_by_its_ray_submission_id_too(client: TestClient, admin: dict[str, str]) -> None:
    """Plain-Ray users know their job by ``raysubmit_...``: get, logs and stop take it as raypod's id."""
    client.post("/api/v1/clusters", json={"name": "c"}, headers=admin).raise_for_status()
    wait_ready(client, admin, "default", "c")
    uid = client.get("/api/v1/namespaces/default/clusters/c", headers=admin).json()["uid"]
    client.app.state.clusters.backend.ray_submit(uid, "raysubmit_AbC123", "python plain.py")  # type: ignore[attr-defined]
    deadline = time.monotonic() + 15  # imported by the supervisor within its import interval (3 s)
    while (found := client.get("/api/v1/jobs/raysubmit_AbC123", headers=admin)).status_code != 200:
        assert time.monotonic() < deadline, found.text
        time.sleep(0.1)
    assert found.json()["id"].startswith("rj-") and found.json()["spec"]["entrypoint"] == "python plain.py"
    assert client.post("/api/v1/jobs/raysubmit_AbC123/stop", headers=admin).json()["stop_requested"] is True
    assert client.get("/api/v1/jobs/raysubmit_nope", headers=admin).status_code == 404
    assert client.get("/api/v1/jobs/raysubmit_../x", headers=admin).status_code in (404, 422)
