"""The catalog and deploy API in-process (fake backend: no Ray): who may do what, and every refusal a deploy can
meet before it reaches a cluster. The deploys that do reach Ray Serve are tests/e2e/test_serving.py's."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from raypod import config, state
from raypod.backends.fake import FakeBackend
from raypod.server.app import create_app
from tests.server.conftest import add_model, make_user, wait_ready


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers", reason="needs transformers: pip install -e '.[serving]'")
    from raypod.serving.testing import build_llama

    return build_llama(tmp_path_factory.mktemp("model") / "tiny", "tiny", max_context=512)


def test_the_catalog_reads_a_source_and_guards_its_entries(
    client: TestClient, admin: dict[str, str], model_dir: Path
) -> None:
    added = add_model(client, admin, {"id": "org/tiny", "source": str(model_dir)})
    assert added["status"] == "ADDED", added
    entry = added["entry"]
    assert entry["architecture"] == "LlamaForCausalLM" and entry["max_context"] == 512 and entry["added_by"] == "admin"
    assert client.get("/api/v1/models/org/tiny", headers=admin).json()["files"] == entry["files"]
    again = client.post("/api/v1/models", json={"id": "org/tiny", "source": str(model_dir)}, headers=admin)
    assert again.status_code == 409 and "--replace" in again.json()["message"]
    alice = make_user(client, admin, "alice", "ml")
    assert [m["id"] for m in client.get("/api/v1/models", headers=alice).json()] == ["org/tiny"]
    assert client.delete("/api/v1/models/org/tiny", headers=alice).status_code == 403
    assert client.post("/api/v1/models", json={"id": "x", "source": str(model_dir)}, headers=alice).status_code == 403
    missing = add_model(client, admin, {"id": "gone", "source": str(model_dir / "nope")})
    assert missing["status"] == "FAILED" and "does not exist" in missing["failure"], missing
    assert client.get("/api/v1/models/gone", headers=admin).status_code == 404, "a failed source is no entry"
    assert client.get("/api/v1/models/gone/addition", headers=alice).json()["status"] == "FAILED"
    fixed = add_model(client, admin, {"id": "gone", "source": str(model_dir)})
    assert fixed["status"] == "ADDED", "a failed request is asked again with the same id"
    assert client.delete("/api/v1/models/gone", headers=admin).status_code == 200
    secret = {"id": "s", "source": "s3://b/m", "storage_options": {"key": "AKIA", "secret": "x"}}
    refused = client.post("/api/v1/models", json=secret, headers=admin)
    assert refused.status_code == 422 and "AKIA" not in refused.text
    assert client.get("/api/v1/models/no-such", headers=alice).status_code == 404
    assert client.get("/api/v1/models/no-such/addition", headers=alice).status_code == 404
    assert client.get("/api/v1/models").status_code == 401
    assert client.delete("/api/v1/models/org/tiny", headers=admin).status_code == 200
    assert client.get("/api/v1/models", headers=admin).json() == []


def test_no_request_reads_a_source_and_a_second_request_for_the_same_id_waits_its_turn(
    tmp_path: Path, model_dir: Path
) -> None:
    """The serving applier reads sources; the request only stores what was asked. With the applier not running,
    a POST answers INSPECTING and the catalog stays empty until a pass."""
    settings = config.Settings(home=tmp_path, reconcile_interval_s=0.05, tls=False)
    with TestClient(create_app(settings, backend=FakeBackend()), raise_server_exceptions=False) as client:
        plane = client.app.state.control_plane  # type: ignore[attr-defined]
        plane.serving_applier.stop()
        admin = {"Authorization": f"Bearer {json.loads((tmp_path / 'credentials').read_text())['token']}"}
        asked = client.post("/api/v1/models", json={"id": "tiny", "source": str(model_dir)}, headers=admin)
        assert asked.status_code == 202 and asked.json()["status"] == "INSPECTING"
        assert client.get("/api/v1/models", headers=admin).json() == []
        twice = client.post("/api/v1/models", json={"id": "tiny", "source": str(model_dir)}, headers=admin)
        assert twice.status_code == 409 and "being added" in twice.json()["message"]
        plane.serving_applier.run_once()
        assert client.get("/api/v1/models/tiny/addition", headers=admin).json()["status"] == "ADDED"
        assert [m["id"] for m in client.get("/api/v1/models", headers=admin).json()] == ["tiny"]


def test_a_deploy_is_refused_with_a_clear_message_before_it_reaches_the_cluster(
    client: TestClient, admin: dict[str, str], model_dir: Path
) -> None:
    assert add_model(client, admin, {"id": "tiny", "source": str(model_dir)})["status"] == "ADDED"
    spec = {"name": "c", "head": {"cpus": 1, "memory": "256Mi"}, "worker_groups": []}
    client.post("/api/v1/clusters", json=spec, headers=admin).raise_for_status()
    wait_ready(client, admin, "default", "c")
    url = "/api/v1/namespaces/default/clusters/c/deployments"

    unknown = client.post(url, json={"model": "nope"}, headers=admin)
    assert unknown.status_code == 404 and "raypod model list" in unknown.json()["message"]
    too_big = client.post(url, json={"model": "tiny"}, headers=admin)
    assert too_big.status_code == 422 and "of memory per replica" in too_big.json()["message"]
    assert "keys and values for 512 tokens" in too_big.json()["message"], "the context reserved at start counts"
    cpus = client.post(url, json={"model": "tiny", "cpus": 8}, headers=admin)
    assert cpus.status_code == 422 and "CPUs" in cpus.json()["message"]
    bad = client.post(url, json={"model": "tiny", "autoscale": [3, 1]}, headers=admin)
    assert bad.status_code == 422
    bad_name = client.post(url, json={"model": "tiny", "name": "Not_A_Name"}, headers=admin)
    assert bad_name.status_code == 422
    bob = make_user(client, admin, "bob", "other")
    other = "/api/v1/namespaces/default/clusters/none/deployments"
    assert client.post(url, json={"model": "tiny"}, headers=bob).status_code == 403
    assert client.post(other, json={"model": "tiny"}, headers=bob).status_code == 403, "no cluster names leak"
    assert client.get(url, headers=admin).json() == []


class HidingBackend(FakeBackend):
    """Nodes that do not see the server's temporary directory (as sandboxed local nodes do not)."""

    def hidden_from_nodes(self, cluster_id: str, path: str) -> str | None:
        return "sandboxed nodes have a /tmp of their own" if path.startswith(tempfile.gettempdir()) else None


def test_adding_a_model_the_nodes_cannot_read_warns_when_it_is_added(tmp_path: Path, model_dir: Path) -> None:
    settings = config.Settings(home=tmp_path / "home", reconcile_interval_s=0.05, tls=False)
    with TestClient(create_app(settings, backend=HidingBackend()), raise_server_exceptions=False) as client:
        admin = {"Authorization": f"Bearer {json.loads((tmp_path / 'home' / 'credentials').read_text())['token']}"}
        added = add_model(client, admin, {"id": "tiny", "source": str(model_dir)})
        [warning] = added["entry"]["warnings"]
        assert "cannot read" in warning and "will be refused" in warning
        assert client.get("/api/v1/models/tiny", headers=admin).json()["warnings"] == [], "said once, not stored"


class ServingBackend(FakeBackend):
    """Clusters with a Serve endpoint; the dashboard answers Serve's applications with ``serve_applications``
    (None: it does not answer, and a submitted deployment reads as UNKNOWN)."""

    serve_applications: dict[str, Any] | None = None

    def observe(self, cluster_id: str) -> state.ObservedCluster:
        observed = super().observe(cluster_id)
        if observed.endpoints:
            observed.endpoints["serve"] = f"http://fake:8000/{cluster_id}"
        return observed

    def _answer_job_api(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/api/serve/applications/") and self.serve_applications is not None:
            return httpx.Response(200, json={"applications": self.serve_applications})
        return super()._answer_job_api(request)


def test_a_deploy_is_stored_and_the_applier_checks_the_files_submits_and_deletes_it(
    tmp_path: Path, model_dir: Path
) -> None:
    """The request answers 202 at once with NOT_STARTED: checksumming the model and submitting Serve's job happen
    on the deployment applier's thread, which records a corrupt file as DEPLOY_FAILED with the reason."""
    backend = ServingBackend()
    settings = config.Settings(home=tmp_path / "home", reconcile_interval_s=0.05, tls=False)
    broken = tmp_path / "broken"
    shutil.copytree(model_dir, broken)
    with TestClient(create_app(settings, backend=backend), raise_server_exceptions=False) as client:
        admin = {"Authorization": f"Bearer {json.loads((tmp_path / 'home' / 'credentials').read_text())['token']}"}
        for model, source in (("tiny", model_dir), ("broken", broken)):
            assert add_model(client, admin, {"id": model, "source": str(source)})["status"] == "ADDED"
        weights = broken / "model.safetensors"
        data = bytearray(weights.read_bytes())
        data[len(data) // 2] ^= 0xFF
        weights.write_bytes(bytes(data))
        spec = {"name": "c", "head": {"cpus": 1, "memory": "2Gi"}, "worker_groups": []}
        client.post("/api/v1/clusters", json=spec, headers=admin).raise_for_status()
        wait_ready(client, admin, "default", "c")
        uid = client.get("/api/v1/namespaces/default/clusters/c", headers=admin).json()["uid"]
        url = "/api/v1/namespaces/default/clusters/c/deployments"

        managed_l2 = client.post(url, json={"model": "tiny"}, headers=admin)
        assert managed_l2.status_code == 422 and "give the KV cache an L2 address" in managed_l2.json()["message"]
        corrupt = client.post(url, json={"model": "broken", "name": "bad", "l2": "none"}, headers=admin)
        assert corrupt.status_code == 202 and corrupt.json()["status"] == "NOT_STARTED", corrupt.text
        failed = until(client, admin, f"{url}/bad", lambda d: d["status"] == "DEPLOY_FAILED")
        assert "model.safetensors is corrupt" in failed["message"]

        deployed = client.post(url, json={"model": "tiny", "name": "good", "l2": "none"}, headers=admin)
        assert deployed.status_code == 202 and deployed.json()["deploy_job"] == "", deployed.text
        submitted = until(client, admin, f"{url}/good", lambda d: d["deploy_job"] != "")
        assert submitted["deploy_job"].startswith("rs-deploy-good-") and submitted["status"] == "UNKNOWN"
        assert submitted["deploy_job"] in backend.ray_jobs[uid]
        replica = {"replica_id": "r1", "state": "STARTING", "node_id": "n1", "pid": 7}
        backend.serve_applications = {"good": {"status": "RUNNING", "deployments": {"d": {"replicas": [replica]}}}}
        running = client.get(f"{url}/good", headers=admin).json()
        assert running["status"] == "RUNNING" and [r["state"] for r in running["replicas"]] == ["STARTING"]

        deleting = client.delete(f"{url}/good", headers=admin)
        assert deleting.status_code == 202 and deleting.json()["status"] == "DELETING"
        until(client, admin, url, lambda listed: [d["name"] for d in listed] == ["bad"])
        assert any(job.startswith("rs-delete-good-") for job in backend.ray_jobs[uid])


def until(client: TestClient, headers: dict[str, str], url: str, check: Callable[[Any], bool]) -> Any:
    deadline = time.monotonic() + 15
    while not check(found := client.get(url, headers=headers).json()):
        assert time.monotonic() < deadline, found
        time.sleep(0.05)
    return found
