"""The workspace API in-process (fake backend: no Ray, no IDE): who may do what, the lifecycle in the cluster's
spec, and the refusals. A real JupyterLab on a real cluster is tests/e2e/test_spaces.py's."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.server.conftest import make_user, wait_ready

pytest.importorskip("jupyterlab", reason="needs JupyterLab: pip install -e '.[spaces]'")


def spec_of(client: TestClient, headers: dict[str, str], namespace: str, name: str) -> dict[str, object]:
    return client.get(f"/api/v1/namespaces/{namespace}/clusters/{name}", headers=headers).json()["spec"]


def test_a_workspace_lives_in_its_clusters_spec_and_only_its_owner_and_admins_see_it(
    client: TestClient, admin: dict[str, str]
) -> None:
    alice = make_user(client, admin, "alice", "ml")
    bob = make_user(client, admin, "bob", "ml")
    for name in ("one", "two"):
        client.post("/api/v1/clusters", json={"name": name, "namespace": "ml"}, headers=alice).raise_for_status()
        wait_ready(client, alice, "ml", name)
    created = client.post("/api/v1/namespaces/ml/spaces", json={"name": "nb", "cluster": "one"}, headers=alice)
    assert created.status_code == 201, created.text
    assert created.json()["owner"] == "alice" and created.json()["url"] == "/spaces/ml/nb/"
    assert [s["name"] for s in spec_of(client, alice, "ml", "one")["spaces"]] == ["nb"]  # type: ignore[union-attr]
    nodes = client.get("/api/v1/namespaces/ml/clusters/one", headers=alice).json()["status"]["desired_nodes"]
    assert nodes == 2, "the head and the workspace's node"

    assert client.get("/api/v1/namespaces/ml/spaces/nb", headers=bob).status_code == 404, "bob is not its owner"
    assert client.get("/api/v1/namespaces/ml/spaces", headers=bob).json() == []
    assert client.post("/api/v1/namespaces/ml/spaces/nb/stop", headers=bob).status_code == 404
    on_alices = client.post("/api/v1/namespaces/ml/spaces", json={"name": "b", "cluster": "one"}, headers=bob)
    assert on_alices.status_code == 403, "a workspace runs code on the cluster: owner or team admin only"
    assert [s["name"] for s in client.get("/api/v1/spaces", headers=admin).json()] == ["nb"]

    assert client.post("/api/v1/namespaces/ml/spaces/nb/stop", headers=alice).json()["state"] == "Stopped"
    assert spec_of(client, alice, "ml", "one")["spaces"][0]["running"] is False  # type: ignore[index]
    assert client.post("/api/v1/namespaces/ml/spaces/nb/start", headers=alice).json()["state"] != "Stopped"
    moved = client.post("/api/v1/namespaces/ml/spaces/nb/move", json={"cluster": "two"}, headers=alice)
    assert moved.status_code == 200 and moved.json()["cluster"] == "two"
    assert spec_of(client, alice, "ml", "one")["spaces"] == []
    deleted = client.delete("/api/v1/namespaces/ml/spaces/nb", headers=alice)
    assert deleted.status_code == 200 and deleted.json()["state"] == "Deleted"
    assert client.get("/api/v1/namespaces/ml/spaces/nb", headers=alice).status_code == 404


def test_bad_workspaces_are_refused_with_the_field_named(client: TestClient, admin: dict[str, str]) -> None:
    client.post("/api/v1/clusters", json={"name": "c"}, headers=admin).raise_for_status()
    base = "/api/v1/namespaces/default/spaces"
    cases = [
        ({"name": "Bad_Name", "cluster": "c"}, 422, "workspace name"),
        ({"name": "x", "cluster": "c", "kind": "emacs"}, 422, "kind"),
        ({"name": "x", "cluster": "c", "memory": "lots"}, 422, "memory"),
        ({"name": "x", "cluster": "nope"}, 404, "nope"),
        ({"name": "x", "cluster": "c", "unknown": 1}, 422, "unknown"),
    ]
    for body, status, text in cases:
        answer = client.post(base, json=body, headers=admin)
        assert answer.status_code == status and text in answer.text, (body, answer.text)
    assert client.post(base, json={"name": "x", "cluster": "c"}, headers=admin).status_code == 201
    again = client.post(base, json={"name": "x", "cluster": "c"}, headers=admin)
    assert again.status_code == 409 and "already exists" in again.json()["message"]
    group = client.post("/api/v1/clusters", json={"name": "d", "worker_groups": [{"name": "space"}]}, headers=admin)
    assert group.status_code == 422 and "reserved for workspaces" in group.json()["message"]


def test_a_python_env_that_cannot_run_a_drivers_kernel_is_refused_with_how_to_fix_it(
    client: TestClient, admin: dict[str, str], tmp_path: Path
) -> None:
    client.post("/api/v1/clusters", json={"name": "c"}, headers=admin).raise_for_status()
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    base = "/api/v1/namespaces/default/spaces"
    cases = [
        ("relative/env", "an absolute path"),
        ("/no/such/env", "give the directory of a virtual environment that the cluster's nodes can read"),
        (str(bare), "lacks ipykernel or Ray; install them with: "),
    ]
    for python_env, text in cases:
        answer = client.post(base, json={"name": "x", "cluster": "c", "python_env": python_env}, headers=admin)
        assert answer.status_code == 422 and text in answer.json()["message"], answer.text
    editor = client.post(
        base, json={"name": "x", "cluster": "c", "kind": "code-editor", "python_env": str(bare)}, headers=admin
    )
    assert editor.status_code == 422
    assert client.get(base, headers=admin).json() == [], "a refused workspace was half created"


def test_opening_the_workspace_of_a_suspended_cluster_resumes_the_cluster(
    client: TestClient, admin: dict[str, str]
) -> None:
    client.post("/api/v1/clusters", json={"name": "c"}, headers=admin).raise_for_status()
    wait_ready(client, admin, "default", "c")
    client.post("/api/v1/namespaces/default/spaces", json={"name": "nb", "cluster": "c"}, headers=admin)
    clusters = client.app.state.clusters  # type: ignore[attr-defined]
    clusters.suspend(clusters.store.get("default", "c"), "idle for 1 s")
    assert client.get("/api/v1/namespaces/default/clusters/c", headers=admin).json()["suspended_at"]

    opened = client.get("/spaces/default/nb/lab", headers=admin)
    assert opened.status_code == 409 and "is being resumed" in opened.json()["message"], opened.text
    assert client.get("/api/v1/namespaces/default/clusters/c", headers=admin).json()["suspended_at"] is None
    events = client.get("/api/v1/namespaces/default/clusters/c/events", headers=admin).json()
    assert "Resumed" in [e["reason"] for e in events]


def test_a_workspaces_files_are_deleted_by_the_loop_once_its_node_is_gone_and_never_while_it_is_unknown(
    client: TestClient, admin: dict[str, str], tmp_path: Path
) -> None:
    """The request only records the deletion (issue 30: every change through the loop): deleting the files in the
    request raced the loop, which could give them (a KubeRay claim) back to the node it had not removed yet."""
    from raypod.capabilities.spaces import ide

    client.post("/api/v1/clusters", json={"name": "c"}, headers=admin).raise_for_status()
    wait_ready(client, admin, "default", "c")
    base = "/api/v1/namespaces/default/spaces"
    assert client.post(base, json={"name": "nb", "cluster": "c"}, headers=admin).status_code == 201
    files = ide.files_dir(tmp_path, "default", "nb", "admin")
    files.mkdir(parents=True, exist_ok=True)
    (files / "notebook.ipynb").write_text("{}")
    plane = client.app.state.control_plane  # type: ignore[attr-defined]
    uid = plane.clusters.store.get("default", "c").uid
    wait_until(lambda: "space-nb" in plane.backend.nodes[uid], "the workspace's node")
    plane.backend.set_gcs_reachable(uid, False)  # its node is now unknown: nothing may be deleted

    deleted = client.delete(f"{base}/nb", params={"keep_files": "false"}, headers=admin)
    assert deleted.status_code == 200 and deleted.json()["state"] == "Deleted"
    again = client.post(base, json={"name": "nb", "cluster": "c"}, headers=admin)
    assert again.status_code == 409 and "being deleted" in again.json()["message"], again.text
    plane.reconciler.wake(uid)
    time_to_act = time.monotonic() + 1.0  # some passes of the loop (every 0.05 s)
    while time.monotonic() < time_to_act:
        assert (files / "notebook.ipynb").exists(), "deleted while its node was unknown"
        time.sleep(0.05)

    plane.backend.set_gcs_reachable(uid, True)
    wait_until(lambda: not files.exists(), "the files deleted once the node is gone")
    assert "space-nb" not in plane.backend.nodes[uid]
    events = client.get("/api/v1/namespaces/default/clusters/c/events", headers=admin).json()
    reasons = [e["reason"] for e in events]
    assert reasons.index("SpaceFilesDeleted") > reasons.index("DeletedNode"), reasons
    assert client.post(base, json={"name": "nb", "cluster": "c"}, headers=admin).status_code == 201


def wait_until(check: Callable[[], object], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
