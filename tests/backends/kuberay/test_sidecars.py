"""Node add-ons on KubeRay against the emulated API server (kmock: no real one can run here): workspaces as
worker groups of their own with their IDE, their files' claim and their Service; KubeRay's part (pods) is played
by the test."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from raypod import config
from raypod.backends.kuberay import addons as pod_addons
from raypod.backends.kuberay import backend as kuberay
from raypod.server.app import create_app
from tests.server.test_hangwatch import wait_for as until

from .conftest import Emulator
from .test_backend import SPEC, kuberay_starts

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning")


@pytest.fixture
def backend(emulator: Emulator) -> Iterator[kuberay.KubeRayBackend]:
    made = kuberay.KubeRayBackend(emulator.api, request_timeout_s=2.0)
    yield made
    emulator.relay.close()
    made.close()


@pytest.fixture
def api(tmp_path: Path, backend: kuberay.KubeRayBackend) -> Iterator[TestClient]:
    settings = config.Settings(home=tmp_path, reconcile_interval_s=0.05, tls=False)
    with TestClient(create_app(settings, backend=backend), raise_server_exceptions=False) as client:
        token = json.loads((tmp_path / "credentials").read_text())["token"]
        client.headers["Authorization"] = f"Bearer {token}"
        yield client


def raycluster(emulator: Emulator) -> dict[str, Any]:
    [found] = emulator.rayclusters()
    return found


def group(emulator: Emulator, name: str) -> dict[str, Any] | None:
    groups = raycluster(emulator)["spec"].get("workerGroupSpecs", [])
    return next((g for g in groups if g["groupName"] == name), None)


def rayservice(emulator: Emulator) -> Any:
    found = emulator.custom.list_namespaced_custom_object("ray.io", "v1", "default", "rayservices")["items"]
    return found[0] if found else None


def claims(emulator: Emulator) -> list[str]:
    return [c.metadata.name for c in emulator.core.list_namespaced_persistent_volume_claim("default").items]


def test_a_workspace_is_a_zero_cpu_pod_with_its_ide_and_keeps_its_files_claim_across_stop_start_and_delete(
    emulator: Emulator, api: TestClient
) -> None:
    api.post("/api/v1/clusters", json=SPEC.model_dump(mode="json")).raise_for_status()
    until(emulator.rayclusters, "the RayCluster")
    kuberay_starts(emulator)
    base = "/api/v1/namespaces/default/spaces"
    created = api.post(base, json={"name": "nb", "cluster": "demo"})
    assert created.status_code == 201, created.text

    space = until(lambda: group(emulator, "space-nb"), "the workspace's worker group")
    assert space["replicas"] == 1 and space["rayStartParams"]["num-cpus"] == "0"
    pod = space["template"]["spec"]
    ide = next(c for c in pod["containers"] if c["name"] == "raypod-ide")
    assert ide["command"][:3] == ["python", "-m", "jupyterlab"] and "--ip=0.0.0.0" in ide["command"]
    token = next(e for e in ide["env"] if e["name"] == pod_addons.TOKEN_VARIABLE)
    assert token["valueFrom"]["secretKeyRef"]["name"] == "demo-raypod-sidecars", "the IDE's token is in a Secret"
    [claim] = [v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v]
    until(lambda: claim in claims(emulator), "the files' claim")
    service = until(
        lambda: next(
            (s for s in emulator.core.list_namespaced_service("default").items if s.metadata.name == "demo-space-nb"),
            None,
        ),
        "the IDE's Service",
    )
    assert service.spec.selector == {"ray.io/cluster": "demo", "ray.io/group": "space-nb"}
    secret = emulator.core.read_namespaced_secret("demo-raypod-sidecars", "default")
    assert "space-nb.ide" in secret.data

    emulator.start_pod("default", "demo", "space-nb", "demo-space-nb-x1")
    emulator.run("default", "demo-space-nb-x1", ip="10.0.0.9")
    ready = until(lambda: api.get(f"{base}/nb").json()["state"] == "Ready" and api.get(f"{base}/nb").json(), "Ready")
    assert ready["node"] == "space-nb"
    uid = api.get("/api/v1/namespaces/default/clusters/demo").json()["uid"]
    proxy = f"{emulator.api.configuration.host}/api/v1/namespaces/default/services/demo-space-nb:8800/proxy"
    assert api.get("/api/v1/namespaces/default/clusters/demo").json()["status"]["endpoints"]["space/nb"] == proxy
    plane = api.app.state.control_plane  # type: ignore[attr-defined]
    assert plane.backend.sidecar_token(uid, "space-nb", "ide") == plane.backend.sidecar_token(uid, "space-nb", "ide")

    assert api.post(f"{base}/nb/stop").status_code == 200
    until(lambda: group(emulator, "space-nb")["replicas"] == 0, "the group scaled to 0")  # type: ignore[index]
    assert claim in claims(emulator), "a stopped workspace keeps its files"
    assert api.post(f"{base}/nb/start").status_code == 200
    until(lambda: group(emulator, "space-nb")["replicas"] == 1, "the group scaled to 1")  # type: ignore[index]

    assert api.delete(f"{base}/nb").status_code == 200
    until(lambda: group(emulator, "space-nb") is None, "the group removed")
    # KubeRay reconciles only the groups in its spec and leaves a removed group's pods running (kuberay#1739).
    until(lambda: "demo-space-nb-x1" not in [p.metadata.name for p in emulator.pods()], "the workspace's pod deleted")
    until(
        lambda: (
            "demo-space-nb" not in [s.metadata.name for s in emulator.core.list_namespaced_service("default").items]
        ),
        "the IDE's Service deleted",
    )
    assert claim in claims(emulator), "deleted with its files kept (the default)"
    assert api.post(base, json={"name": "nb", "cluster": "demo"}).status_code == 201
    # Deleted at once, maybe before a pass applied it: the loop deletes the claim once the group is gone, so no
    # pass can make it again after (as when the request deleted it, which CI once caught).
    assert api.delete(f"{base}/nb", params={"keep_files": "false"}).status_code == 200
    until(lambda: group(emulator, "space-nb") is None, "the group removed")
    until(lambda: claim not in claims(emulator), "the claim deleted with --delete-files")
    events = api.get("/api/v1/namespaces/default/clusters/demo/events").json()
    assert "SpaceFilesDeleted" in [e["reason"] for e in events]


def test_hang_detection_runs_in_every_pod_and_its_agents_report_over_http_with_their_clusters_credential(
    emulator: Emulator, api: TestClient, tmp_path: Path
) -> None:
    from raypod.capabilities.hangwatch import layout
    from raypod.capabilities.hangwatch.report import Reporter
    from tests.server.test_hangwatch import detection, status

    api.post("/api/v1/clusters", json=SPEC.model_dump(mode="json")).raise_for_status()
    until(emulator.rayclusters, "the RayCluster")
    kuberay_starts(emulator)
    cluster = "/api/v1/namespaces/default/clusters/demo"
    until(lambda: api.get(cluster).json()["status"]["phase"] == "Ready", "Ready")
    assert api.get(f"{cluster}/hangs").json() == [], "answered, not refused: the agents run in the pods"

    workers = group(emulator, "w")
    assert workers is not None
    pod = workers["template"]["spec"]
    agent = next(c for c in pod["containers"] if c["name"] == "raypod-hangwatch-agent")
    assert pod["shareProcessNamespace"] is True, "the agent follows the Ray processes by pid"
    assert agent["command"] == ["python", "-m", "raypod.capabilities.hangwatch.agent", "/raypod/addons/hangwatch"]
    env = {e["name"]: e for e in agent["env"]}
    assert env["RAYPOD_HANGWATCH_REPORT_URL"]["value"].endswith("/api/v1/hangwatch/agents/$(RAYPOD_POD_NAME)")
    key = env["RAYPOD_HANGWATCH_REPORT_TOKEN"]["valueFrom"]["secretKeyRef"]["key"]
    assert "value" not in env["RAYPOD_HANGWATCH_REPORT_TOKEN"], "the credential is in a Secret, not the manifest"
    ray_env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert ray_env["RAY_TRAIN_CALLBACKS"].endswith("HangwatchCallback")
    configmap = emulator.core.read_namespaced_config_map("demo-raypod-addons", "default")
    assert any(k.startswith("w.") for k in configmap.binary_data), "the agent's settings reach the pod"
    secret = emulator.core.read_namespaced_secret("demo-raypod-sidecars", "default")
    token = __import__("base64").b64decode(secret.data[key]).decode()

    def reporter(pod_name: str) -> Reporter:
        made = Reporter(tmp_path / pod_name, f"/api/v1/hangwatch/agents/{pod_name}", token)
        made._client = api  # the server in-process: TestClient is an httpx.Client
        return made

    first, second = reporter("demo-w-worker-a"), reporter("demo-w-worker-b")
    layout.write_json(first.root / "status.json", status(0, 25.0))
    layout.write_json(second.root / "status.json", status(1, 22.0))
    until(lambda: second.report() + first.report(), "the control plane's hang request, in a report's answer")
    [request] = [layout.read_json(path) for path in (first.root / "requests").glob("*.json")]
    assert request is not None and request["kind"] == "hang" and request["ranks"][0] == 0
    for rank, made in enumerate((first, second)):
        layout.write_json(layout.detections_dir(made.root) / f"d{rank}.json", detection(rank, "notify", None))
        made.report()
    [merged] = until(
        lambda: [d for d in api.get(f"{cluster}/hangs").json() if len(d["ranks"]) == 2], "the merged detection"
    )
    assert merged["common_wait"] == "all_reduce"

    report = {"status": status(0, 1.0)}
    user = api.post("/api/v1/hangwatch/agents/demo-w-worker-a", json=report)
    assert user.status_code == 401, "a user's token is no agent credential"
    forged = token.rsplit(".", 1)[0] + ".x"
    headers = {"Authorization": f"Bearer {forged}"}
    assert api.post("/api/v1/hangwatch/agents/a", json=report, headers=headers).status_code == 401
    headers = {"Authorization": f"Bearer {token}"}
    assert api.post("/api/v1/hangwatch/agents/..", json=report, headers=headers).status_code in (404, 422)
    bad = {"detections": {"../../etc/passwd": {}}}
    assert api.post("/api/v1/hangwatch/agents/a", json=bad, headers=headers).status_code == 422


class FakeExec:
    """The websocket ``pods/exec`` answers with (a mock: kmock has no exec, and no API server can run here): each
    call is recorded; the pods in ``failing`` exit 1."""

    def __init__(self, failing: set[str]) -> None:
        self.failing = failing
        self.calls: list[tuple[str, str, list[str]]] = []

    def __call__(self, method: Any, pod: str, namespace: str, **kwargs: Any) -> Any:
        self.calls.append((pod, kwargs["container"], kwargs["command"]))
        failing = pod in self.failing

        class Response:
            returncode = 1 if failing else 0
            _open = True

            def is_open(self) -> bool:
                return self._open

            def update(self, timeout: float) -> None:
                self._open = False

            def peek_stdout(self) -> bool:
                return True

            def read_stdout(self) -> str:
                return "disk full\n" if failing else ""

            def peek_stderr(self) -> bool:
                return False

            def close(self) -> None:
                pass

        return Response()


def test_health_checks_run_in_the_ray_container_and_a_failing_pod_is_replaced(
    emulator: Emulator, api: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from raypod.backends.kuberay import podexec

    fake = FakeExec({"demo-w-worker-a"})
    monkeypatch.setattr(podexec, "stream", fake)
    check = {"name": "disk", "command": "test -w /tmp", "period_s": 1, "timeout_s": 1, "failure_threshold": 1}
    spec = {**SPEC.model_dump(mode="json"), "health_checks": [check]}
    created = api.post("/api/v1/clusters", json=spec)
    assert created.status_code == 202, created.text
    until(emulator.rayclusters, "the RayCluster")
    kuberay_starts(emulator)
    until(lambda: "demo-w-worker-a" not in [p.metadata.name for p in emulator.pods()], "the failing pod deleted")
    assert "demo-w-worker-b" in [p.metadata.name for p in emulator.pods()], "a healthy pod is left alone"
    _, container, command = next(call for call in fake.calls if call[0] == "demo-w-worker-a")
    assert container == "ray-worker" and command == ["timeout", "-s", "KILL", "1", "/bin/sh", "-c", "test -w /tmp"]
    events = api.get("/api/v1/namespaces/default/clusters/demo/events").json()
    assert any("disk" in e["message"] for e in events), [e["message"] for e in events]


def test_the_managed_l2_is_a_password_protected_valkey_only_the_clusters_serving_pods_may_reach(
    tmp_path: Path, emulator: Emulator, api: TestClient
) -> None:
    import fsspec
    import yaml

    from raypod.backends.kuberay import kvstore
    from raypod.serving.testing import build_llama
    from tests.server.conftest import add_model

    model = build_llama(tmp_path / "tiny", "tiny", max_context=512)
    fs = fsspec.filesystem("memory")
    for path in model.iterdir():
        fs.pipe_file(f"/models/l2/{path.name}", path.read_bytes())
    assert add_model(api, {}, {"id": "tiny", "source": "memory://models/l2"})["status"] == "ADDED"
    spec = {**SPEC.model_dump(mode="json"), "head": {"cpus": 1, "memory": "2Gi"}}
    api.post("/api/v1/clusters", json=spec).raise_for_status()
    deployed = api.post("/api/v1/namespaces/default/clusters/demo/deployments", json={"model": "tiny", "name": "chat"})
    assert deployed.status_code == 202, deployed.text

    applied = until(lambda: rayservice(emulator), "the RayService, with raypod's own L2")
    [app] = yaml.safe_load(applied["spec"]["serveConfigV2"])["applications"]
    assert app["args"]["settings"]["l2_url_file"] == kvstore.URL_FILE and not app["args"]["settings"].get("l2_url")
    assert "redis://" not in json.dumps(applied), "the password is in no manifest"
    head = applied["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]
    assert head["metadata"]["labels"][kvstore.CLIENT_LABEL] == "demo"
    assert {"name": "raypod-kv", "mountPath": "/raypod/kv", "readOnly": True} in head["spec"]["containers"][0][
        "volumeMounts"
    ]
    secret = emulator.core.read_namespaced_secret("demo-raypod-kv", "default")
    url = __import__("base64").b64decode(secret.data["url"]).decode()
    password = __import__("base64").b64decode(secret.data["password"]).decode()
    assert url == f"redis://:{password}@demo-raypod-kv.default.svc:6379/0" and len(password) >= 32
    apps = __import__("kubernetes").client.AppsV1Api(emulator.core.api_client)
    [container] = apps.read_namespaced_deployment("demo-raypod-kv", "default").spec.template.spec.containers
    assert container.args[:2] == ["--requirepass", "$(VALKEY_PASSWORD)"] and "allkeys-lru" in container.args
    networking = __import__("kubernetes").client.NetworkingV1Api(emulator.core.api_client)
    policy = networking.read_namespaced_network_policy("demo-raypod-kv", "default")
    [rule] = policy.spec.ingress
    assert rule._from[0].pod_selector.match_labels == {kvstore.CLIENT_LABEL: "demo"}
    assert emulator.core.read_namespaced_service("demo-raypod-kv", "default").spec.ports[0].port == 6379

    assert api.delete("/api/v1/namespaces/default/clusters/demo").status_code == 202
    until(
        lambda: (
            "demo-raypod-kv" not in [s.metadata.name for s in emulator.core.list_namespaced_secret("default").items]
        ),
        "the store's Secret deleted with its cluster",
    )


def test_an_api_server_outage_in_the_middle_of_a_workspace_start_loses_nothing_and_does_nothing_twice(
    emulator: Emulator, api: TestClient
) -> None:
    api.post("/api/v1/clusters", json=SPEC.model_dump(mode="json")).raise_for_status()
    until(emulator.rayclusters, "the RayCluster")
    kuberay_starts(emulator)
    until(lambda: api.get("/api/v1/namespaces/default/clusters/demo").json()["status"]["phase"] == "Ready", "Ready")
    emulator.relay.cut()
    created = api.post("/api/v1/namespaces/default/spaces", json={"name": "nb", "cluster": "demo"})
    assert created.status_code == 201, "the request is stored: the loop applies it when it can"
    until(
        lambda: any(
            e["reason"] == "FailedToApply" for e in api.get("/api/v1/namespaces/default/clusters/demo/events").json()
        ),
        "the apply failing during the outage",
    )
    assert group(emulator, "space-nb") is None
    emulator.relay.restore()
    until(lambda: group(emulator, "space-nb"), "the workspace's group once the API server is back")
    plane = api.app.state.control_plane  # type: ignore[attr-defined]
    for _ in range(5):  # more passes change nothing: each object exists once
        plane.reconciler.reconcile_all()
    services = [s.metadata.name for s in emulator.core.list_namespaced_service("default").items]
    assert services.count("demo-space-nb") == 1
    assert len(claims(emulator)) == 1
    workers = [g["groupName"] for g in raycluster(emulator)["spec"]["workerGroupSpecs"]]
    assert workers == ["w", "space-nb"]
    for kind in ("persistentvolumeclaims", "services"):
        creates = [r for r in emulator.handler["post"] if f"/{kind}'" in str(r) or f"/{kind}" in str(r)]
        assert len(creates) == 1, (kind, creates)


def test_a_model_on_the_servers_disk_is_staged_into_object_storage_for_the_pods(
    tmp_path: Path, emulator: Emulator, backend: kuberay.KubeRayBackend
) -> None:
    import fsspec
    import yaml

    from raypod.serving.testing import build_llama
    from tests.server.conftest import add_model

    model = build_llama(tmp_path / "tiny", "tiny", max_context=512)
    settings = config.Settings(
        home=tmp_path / "home", reconcile_interval_s=0.05, tls=False, model_staging_url="memory://staged"
    )
    with TestClient(create_app(settings, backend=backend), raise_server_exceptions=False) as api:
        token = json.loads((tmp_path / "home" / "credentials").read_text())["token"]
        api.headers["Authorization"] = f"Bearer {token}"
        added = add_model(api, {}, {"id": "tiny", "source": str(model)})
        assert added["status"] == "ADDED" and added["entry"]["warnings"] == [], "staged, so no warning"
        spec = {**SPEC.model_dump(mode="json"), "head": {"cpus": 1, "memory": "2Gi"}}
        api.post("/api/v1/clusters", json=spec).raise_for_status()
        url = "/api/v1/namespaces/default/clusters/demo/deployments"
        assert api.post(url, json={"model": "tiny", "name": "chat", "l2": "none"}).status_code == 202

        [app] = yaml.safe_load(until(lambda: rayservice(emulator), "the RayService")["spec"]["serveConfigV2"])[
            "applications"
        ]
        source = app["args"]["settings"]["entry"]["source"]
        assert source.startswith("memory://staged/tiny/"), source
        staged = fsspec.filesystem("memory")
        names = sorted(path.rsplit("/", 1)[1] for path in staged.find(source.removeprefix("memory://")))
        assert names == sorted(path.name for path in model.iterdir())
