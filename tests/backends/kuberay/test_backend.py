"""The KubeRay backend against an emulated API server (kmock), with the test playing KubeRay's part on pods:
a spec becomes a RayCluster, pods become nodes, a failed pod is replaced, and what the API server does wrong (an
outage, 409, 410, a missing CRD, RBAC) gives a clear message and loses no desired state."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from kubernetes.client.exceptions import ApiException

from raypod import config, errors, state
from raypod import spec as spec_mod
from raypod.backends.kuberay import backend as kuberay
from raypod.backends.kuberay import manifests
from raypod.controlplane import loop, store
from raypod.server.app import create_app
from tests.server.conftest import add_model

from . import conftest
from .conftest import Emulator

# A relay cut drops live connections mid-response: the client's and the emulator's sockets are then closed by the
# garbage collector, which Python reports as a ResourceWarning.
pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning")

SPEC = spec_mod.parse_spec(
    {"name": "demo", "owner": "ana", "head": {"cpus": 1}, "worker_groups": [{"name": "w", "replicas": 2, "cpus": 1}]}
)


@pytest.fixture
def db(tmp_path: Path) -> store.Store:
    return store.Store(f"sqlite:///{tmp_path / 'raypod.db'}")


@pytest.fixture
def backend(emulator: Emulator) -> Iterator[kuberay.KubeRayBackend]:
    made = kuberay.KubeRayBackend(emulator.api, request_timeout_s=2.0)
    yield made
    emulator.relay.close()  # ends the watches in flight, so the informers' threads stop at once
    made.close()


def until(reconciler: loop.Reconciler, done: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    """Reconcile until ``done()`` is truthy (the watches deliver in the background); fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reconciler.reconcile_all()
        result = done()
        if result:
            return result
        time.sleep(0.05)
    raise AssertionError(f"never happened: {what}")


def view(db: store.Store) -> state.ClusterView:
    return db.get("default", "demo")


def reasons(db: store.Store) -> list[str]:
    return [event.reason for event in db.events("default", "demo")]


def kuberay_starts(emulator: Emulator) -> None:
    """KubeRay's part for SPEC: a head and two workers, running."""
    emulator.start_pod("default", "demo", "", "demo-head-x1", head=True)
    emulator.start_pod("default", "demo", "w", "demo-w-worker-a")
    emulator.start_pod("default", "demo", "w", "demo-w-worker-b")
    for index, pod in enumerate(("demo-head-x1", "demo-w-worker-a", "demo-w-worker-b")):
        emulator.run("default", pod, ip=f"10.0.0.{index + 1}")


def ready_cluster(db: store.Store, emulator: Emulator, backend: kuberay.KubeRayBackend) -> tuple[str, loop.Reconciler]:
    """SPEC applied, KubeRay's pods running, the cluster Ready: its uid and the loop."""
    uid = db.insert(SPEC).uid
    reconciler = loop.Reconciler(db, backend)
    until(reconciler, emulator.rayclusters, "the RayCluster is created")
    kuberay_starts(emulator)
    until(reconciler, lambda: view(db).status.phase is state.ClusterPhase.READY, "Ready")
    return uid, reconciler


def test_a_cluster_becomes_a_raycluster_and_kuberays_pods_become_its_nodes(
    db: store.Store, emulator: Emulator, backend: kuberay.KubeRayBackend
) -> None:
    uid = db.insert(SPEC).uid
    reconciler = loop.Reconciler(db, backend)
    [applied] = until(reconciler, emulator.rayclusters, "the RayCluster is created")
    expected = manifests.raycluster(SPEC)
    assert applied["spec"] == expected["spec"], "the RayCluster is exactly the manifest the console shows"
    assert applied["metadata"]["labels"][kuberay.UID_LABEL] == uid
    assert view(db).status.phase is not state.ClusterPhase.READY

    kuberay_starts(emulator)
    ready = until(reconciler, lambda: view(db).status.phase is state.ClusterPhase.READY and view(db), "Ready")
    assert {(n.name, n.phase) for n in ready.status.nodes} == {
        ("head", state.NodePhase.RUNNING),
        ("w-0", state.NodePhase.RUNNING),
        ("w-1", state.NodePhase.RUNNING),
    }
    assert ready.status.endpoints["dashboard"].endswith("/services/demo-head-svc:dashboard/proxy")
    # Prometheus' HTTP discovery lists status' metrics endpoints: KubeRay's pods' IPs on Ray's metrics port.
    assert {n.metrics_endpoint for n in ready.status.nodes} == {"10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:8080"}
    patches = len(emulator.handler["patch"])
    for _ in range(5):
        reconciler.reconcile_all()
    assert len(emulator.handler["patch"]) == patches, "an unchanged spec cost a write"


def test_scaling_patches_the_raycluster_and_a_failed_pod_is_deleted_for_kuberay_to_replace(
    db: store.Store, emulator: Emulator, backend: kuberay.KubeRayBackend
) -> None:
    uid, reconciler = ready_cluster(db, emulator, backend)

    db.update_spec(uid, SPEC.with_replicas("w", 3))
    until(
        reconciler,
        lambda: emulator.rayclusters()[0]["spec"]["workerGroupSpecs"][0]["replicas"] == 3,
        "the RayCluster asks for 3 workers",
    )
    for _ in range(5):  # KubeRay has not made w-2's pod yet: raypod said it asked once, not every pass
        reconciler.reconcile_all()
    asked = [e for e in db.events("default", "demo") if e.reason == "CreatedWorker" and e.node == "w-2"]
    assert len(asked) == 1, asked

    emulator.set_pod(
        "default",
        "demo-w-worker-a",
        {
            "phase": "Failed",
            "containerStatuses": [
                {
                    "name": "ray",
                    "image": "rayproject/ray",
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}},
                }
            ],
        },
    )
    until(
        reconciler,
        lambda: "demo-w-worker-a" not in {p.metadata.name for p in emulator.pods()},
        "the failed pod is deleted",
    )
    died = next(e for e in db.events("default", "demo") if e.reason == "NodeDied")
    assert "OOMKilled" in died.message
    assert {p.metadata.name for p in emulator.pods()} == {"demo-head-x1", "demo-w-worker-b"}, "only that pod"


def test_an_api_server_outage_makes_nodes_unknown_deletes_nothing_and_loses_no_change(
    db: store.Store, emulator: Emulator, backend: kuberay.KubeRayBackend
) -> None:
    uid, reconciler = ready_cluster(db, emulator, backend)

    emulator.relay.cut()
    emulator.set_pod("default", "demo-w-worker-a", {"phase": "Failed"})  # unseen while the API is away
    db.update_spec(uid, SPEC.with_replicas("w", 4))
    unknown = until(
        reconciler, lambda: view(db).status.phase is state.ClusterPhase.UNKNOWN and view(db), "nodes unknown"
    )
    assert {n.phase for n in unknown.status.nodes} == {state.NodePhase.UNKNOWN}
    assert "FailedToApply" in reasons(db)
    assert not [r for r in emulator.handler["delete"]], "something was deleted during the outage"

    emulator.relay.restore()
    until(
        reconciler,
        lambda: emulator.rayclusters()[0]["spec"]["workerGroupSpecs"][0]["replicas"] == 4,
        "the change made during the outage is applied",
        timeout=30,
    )
    until(
        reconciler,
        lambda: "demo-w-worker-a" not in {p.metadata.name for p in emulator.pods()},
        "the pod that failed during the outage is replaced",
    )


def test_a_watch_told_410_gone_lists_again_and_keeps_serving(emulator: Emulator) -> None:
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old resource version"}}
    sent: list[bool] = []

    def first_watch(request: Any) -> bool:
        if request.params.get("watch") == "true" and not sent:
            sent.append(True)
            return True
        return False

    emulator.handler[first_watch] << (gone,)  # before any watch runs: kmock also pushes reactions into live streams
    core = kuberay.client.CoreV1Api(emulator.api)
    informer = kuberay.Informer("pods", core.list_pod_for_all_namespaces, request_timeout_s=2.0)
    informer.start()
    try:
        deadline = time.monotonic() + 10
        while informer.lists < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sent and informer.lists >= 2, "a 410 did not make the informer list again"
        emulator.start_pod("default", "demo", "w", "late-pod")
        deadline = time.monotonic() + 10
        while informer.get("default", "late-pod") is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert informer.get("default", "late-pod") is not None, "the watch did not resume after the re-list"
        assert informer.synced
    finally:
        emulator.relay.close()
        informer.stop()


def test_a_conflict_on_update_is_retried_and_the_change_lands(
    db: store.Store, emulator: Emulator, backend: kuberay.KubeRayBackend
) -> None:
    uid = db.insert(SPEC).uid
    reconciler = loop.Reconciler(db, backend)
    until(reconciler, emulator.rayclusters, "the RayCluster is created")
    refused: list[bool] = []

    def first_patch(request: Any) -> bool:
        if request.method == "PATCH" and not refused:
            refused.append(True)
            return True
        return False

    emulator.handler[first_patch] << 409
    db.update_spec(uid, SPEC.with_replicas("w", 1))
    until(
        reconciler,
        lambda: emulator.rayclusters()[0]["spec"]["workerGroupSpecs"][0]["replicas"] == 1,
        "the change lands",
    )
    assert refused and any("409" in e.message for e in db.events("default", "demo") if e.reason == "FailedToApply")


@pytest.mark.parametrize("emulator", [{"crds": False}], indirect=True)
def test_without_kuberays_crd_the_message_says_to_install_the_operator(
    db: store.Store, emulator: Emulator, backend: kuberay.KubeRayBackend
) -> None:
    db.insert(SPEC)
    reconciler = loop.Reconciler(db, backend)
    until(reconciler, lambda: "FailedToApply" in reasons(db), "a failure is recorded")
    message = next(e.message for e in db.events("default", "demo") if e.reason == "FailedToApply")
    assert "install the KubeRay operator" in message, message
    assert "Traceback" not in message


def test_rbac_refusals_name_the_missing_verb_and_are_permanent(
    emulator: Emulator, backend: kuberay.KubeRayBackend
) -> None:
    assert backend.clusters.wait_synced(10)
    emulator.handler["post"] << 403
    with pytest.raises(errors.PermanentError, match="forbidden by RBAC"):
        backend.apply("uid-1", SPEC, deleting=False)


def test_a_raycluster_raypod_did_not_make_is_never_taken_over(
    emulator: Emulator, backend: kuberay.KubeRayBackend
) -> None:
    foreign = manifests.raycluster(SPEC)
    emulator.custom.create_namespaced_custom_object("ray.io", "v1", "default", "rayclusters", foreign)
    deadline = time.monotonic() + 10
    while backend.clusters.get("default", "demo") is None and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(errors.PermanentError, match="did not create"):
        backend.apply("uid-1", SPEC, deleting=False)


def test_deleting_a_cluster_deletes_its_raycluster_and_releases_it_once_the_pods_are_gone(
    db: store.Store, emulator: Emulator, backend: kuberay.KubeRayBackend
) -> None:
    uid, reconciler = ready_cluster(db, emulator, backend)
    db.mark_deleting(uid)
    until(reconciler, lambda: not emulator.rayclusters(), "the RayCluster is deleted")
    for pod in emulator.pods():  # Kubernetes' garbage collector removes what the RayCluster owned
        emulator.core.delete_namespaced_pod(pod.metadata.name, "default")
    until(reconciler, lambda: not db.list(), "the cluster is released")


def test_each_cluster_runs_with_a_ray_token_of_its_own_which_raypod_presents_and_deletes_with_it(
    db: store.Store, emulator: Emulator, backend: kuberay.KubeRayBackend
) -> None:
    uid, reconciler = ready_cluster(db, emulator, backend)
    [applied] = emulator.rayclusters()
    auth = applied["spec"]["authOptions"]
    assert auth["mode"] == "token", "KubeRay sets RAY_AUTH_MODE=token and the token in every Ray container"
    secret = emulator.core.read_namespaced_secret(auth["secretName"], "default")
    token = base64.b64decode(secret.data["auth_token"]).decode()
    assert len(token) >= 32 and secret.metadata.labels[kuberay.UID_LABEL] == uid
    assert backend.dashboard_headers(uid)["X-Ray-Authorization"] == f"Bearer {token}"
    restarted = kuberay.KubeRayBackend(emulator.api, request_timeout_s=2.0)
    try:
        assert restarted.clusters.wait_synced(10)
        assert restarted.dashboard_headers(uid)["X-Ray-Authorization"] == f"Bearer {token}", "never rotated"
    finally:
        restarted.close()
    db.mark_deleting(uid)
    until(reconciler, lambda: not emulator.rayclusters(), "the RayCluster is deleted")
    with pytest.raises(ApiException) as gone:
        emulator.core.read_namespaced_secret(auth["secretName"], "default")
    assert gone.value.status == 404, "the token goes with its cluster"


def test_a_token_secret_raypod_did_not_make_is_neither_used_nor_deleted(
    db: store.Store, emulator: Emulator, backend: kuberay.KubeRayBackend
) -> None:
    name = manifests.auth_secret_name(SPEC.name)
    foreign = {"metadata": {"name": name}, "data": {"auth_token": base64.b64encode(b"someone-elses").decode()}}
    emulator.core.create_namespaced_secret("default", foreign)
    uid = db.insert(SPEC).uid
    reconciler = loop.Reconciler(db, backend)
    until(reconciler, lambda: "FailedToApply" in reasons(db), "a failure is recorded")
    message = next(e.message for e in db.events("default", "demo") if e.reason == "FailedToApply")
    assert f"a Secret {name}" in message and "did not create" in message, message
    assert not emulator.rayclusters(), "nothing was applied with a token raypod does not own"
    db.mark_deleting(uid)
    until(reconciler, lambda: not db.list(), "the cluster is released")
    assert emulator.core.read_namespaced_secret(name, "default").data["auth_token"], "the foreign Secret stays"


def test_merge_patch_turns_one_document_into_another() -> None:
    current = {"a": 1, "b": {"c": 2, "d": 3}, "e": [1, 2]}
    desired = {"a": 1, "b": {"c": 5}, "e": [2], "f": "new"}
    assert kuberay.merge_patch(current, desired) == {"b": {"c": 5, "d": None}, "e": [2], "f": "new"}


def test_a_spec_field_the_installed_kuberay_lacks_is_refused_before_anything_is_applied(
    emulator: Emulator, backend: kuberay.KubeRayBackend, kuberay_crds: Path
) -> None:
    crd = yaml.safe_load((kuberay_crds / "ray.io_rayclusters.yaml").read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    del version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["workerGroupSpecs"]["items"][
        "properties"
    ]["labels"]  # as in a KubeRay before 1.5
    extensions = kuberay.client.ApiextensionsV1Api(emulator.core.api_client)
    extensions.create_custom_resource_definition(crd, _preload_content=False)
    assert backend.clusters.wait_synced(10)
    labelled = spec_mod.parse_spec(
        {"name": "demo", "worker_groups": [{"name": "w", "replicas": 1, "labels": {"zone": "a"}}]}
    )
    with pytest.raises(errors.PermanentError, match=r"workerGroupSpecs\[0\].labels"):
        backend.apply("uid-1", labelled, deleting=False)
    assert emulator.rayclusters() == []
    backend.apply("uid-1", SPEC, deleting=False)  # a spec without the field is applied
    assert backend.clusters.wait_synced(5)
    deadline = time.monotonic() + 10
    while not emulator.rayclusters() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [c["metadata"]["name"] for c in emulator.rayclusters()] == ["demo"]


def test_a_job_as_a_rayjob_through_the_api_is_followed_to_its_end(
    tmp_path: Path, emulator: Emulator, backend: kuberay.KubeRayBackend
) -> None:
    rayjobs = dict(conftest.RESOURCES["ray.io/v1/rayclusters"], kind="RayJob", singular="rayjob")
    emulator.handler.resources["ray.io/v1/rayjobs"] = rayjobs
    settings = config.Settings(home=tmp_path, reconcile_interval_s=0.05, tls=False)
    with TestClient(create_app(settings, backend=backend), raise_server_exceptions=False) as api:
        token = json.loads((tmp_path / "credentials").read_text())["token"]
        api.headers["Authorization"] = f"Bearer {token}"
        api.post("/api/v1/clusters", json=SPEC.model_dump(mode="json")).raise_for_status()
        body = {"entrypoint": "python train.py", "max_retries": 3, "as_rayjob": True}
        alone = {"entrypoint": "python train.py", "keep_cluster": True}  # a cluster of its own needs as_rayjob
        assert api.post("/api/v1/namespaces/default/clusters/demo/jobs", json=alone).status_code == 422
        uploaded = {**body, "runtime_env": {"working_dir": "gcs://_ray_pkg_abc.zip"}}
        assert api.post("/api/v1/namespaces/default/clusters/demo/jobs", json=uploaded).status_code == 422
        job = api.post("/api/v1/namespaces/default/clusters/demo/jobs", json=body).json()

        def rayjobs() -> list[Any]:
            return list(emulator.custom.list_namespaced_custom_object("ray.io", "v1", "default", "rayjobs")["items"])

        deadline = time.monotonic() + 10  # the job supervisor submits it
        while not rayjobs() and time.monotonic() < deadline:
            time.sleep(0.05)
        [rayjob] = rayjobs()
        assert rayjob["metadata"]["name"] == job["id"]
        assert rayjob["spec"]["backoffLimit"] == 3 and rayjob["spec"]["shutdownAfterJobFinishes"] is True
        uid = api.get("/api/v1/namespaces/default/clusters/demo").json()["uid"]
        plane = api.app.state.control_plane  # type: ignore[attr-defined]
        shaped = {**plane.manifest(plane.store.by_uid(uid))["spec"], "authOptions": {"mode": "token"}}
        assert rayjob["spec"]["rayClusterSpec"] == shaped, "shaped as the named cluster, with a token of its own"
        pods = [g["template"]["spec"] for g in rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]]
        assert all("raypod-hangwatch-agent" in [c["name"] for c in pod["containers"]] for pod in pods), (
            "hang detection follows a job run as a RayJob"
        )

        def status_of() -> str:
            return str(api.get(f"/api/v1/jobs/{job['id']}").json()["status"])

        for kuberay_says, raypod_says in (("RUNNING", "RUNNING"), ("SUCCEEDED", "SUCCEEDED")):
            emulator.custom.patch_namespaced_custom_object(
                "ray.io", "v1", "default", "rayjobs", job["id"], {"status": {"jobStatus": kuberay_says}}
            )
            deadline = time.monotonic() + 10
            while status_of() != raypod_says and time.monotonic() < deadline:
                time.sleep(0.05)
            assert status_of() == raypod_says
        assert "kubectl -n default logs job/" in api.get(f"/api/v1/jobs/{job['id']}/logs").json()["logs"]


def test_a_model_deployment_is_a_rayservice_followed_to_running_and_routed_by_the_gateway(
    tmp_path: Path, emulator: Emulator, backend: kuberay.KubeRayBackend
) -> None:
    import fsspec

    from raypod.serving.testing import build_llama

    model = build_llama(tmp_path / "tiny", "tiny", max_context=512)
    fs = fsspec.filesystem("memory")  # object storage the pods could read: local directories are refused here
    for path in model.iterdir():
        fs.pipe_file(f"/models/tiny/{path.name}", path.read_bytes())
    settings = config.Settings(home=tmp_path / "home", reconcile_interval_s=0.05, tls=False)
    with TestClient(create_app(settings, backend=backend), raise_server_exceptions=False) as api:
        token = json.loads((tmp_path / "home" / "credentials").read_text())["token"]
        api.headers["Authorization"] = f"Bearer {token}"
        assert add_model(api, {}, {"id": "tiny", "source": "memory://models/tiny"})["status"] == "ADDED"
        spec = {**SPEC.model_dump(mode="json"), "head": {"cpus": 1, "memory": "2Gi"}}
        api.post("/api/v1/clusters", json=spec).raise_for_status()
        url = "/api/v1/namespaces/default/clusters/demo/deployments"
        deployed = api.post(url, json={"model": "tiny", "name": "chat", "replicas": 2, "l2": "redis://kv:6379/0"})
        assert deployed.status_code == 202, deployed.text

        def rayservices() -> list[Any]:
            found = emulator.custom.list_namespaced_custom_object("ray.io", "v1", "default", "rayservices")
            return list(found["items"])

        deadline = time.monotonic() + 10  # the deployment applier applies it
        while not rayservices() and time.monotonic() < deadline:
            time.sleep(0.05)
        [rayservice] = rayservices()
        assert rayservice["metadata"]["name"] == "demo-chat"
        [app] = yaml.safe_load(rayservice["spec"]["serveConfigV2"])["applications"]
        assert app["import_path"] == "raypod.serving.deploy:build" and app["route_prefix"] == "/chat"
        assert app["args"]["settings"]["entry"]["id"] == "tiny" and app["args"]["options"]["num_replicas"] == 2
        assert app["args"]["settings"]["l2_url"] == "redis://kv:6379/0"
        assert rayservice["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParams"]["num-cpus"] == "1"

        def status_of() -> str:
            return str(api.get(f"{url}/chat").json()["status"])

        deadline = time.monotonic() + 10
        while status_of() != "DEPLOYING" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert status_of() == "DEPLOYING", "KubeRay has not reported the application yet"
        running = {"activeServiceStatus": {"applicationStatuses": {"chat": {"status": "RUNNING"}}}}
        emulator.custom.patch_namespaced_custom_object(
            "ray.io", "v1", "default", "rayservices", "demo-chat", {"status": running}
        )
        deadline = time.monotonic() + 10
        while status_of() != "RUNNING" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert status_of() == "RUNNING"
        uid = api.get("/api/v1/namespaces/default/clusters/demo").json()["uid"]
        proxy = "/api/v1/namespaces/default/services/demo-chat-serve-svc:serve/proxy"
        assert backend.serve_endpoints(uid) == {"chat": f"{emulator.api.configuration.host}{proxy}"}, (
            "the gateway sends /serve/chat/ to the RayService's own Serve proxy"
        )
        assert api.delete(f"{url}/chat").status_code == 202
        deadline = time.monotonic() + 10
        while rayservices() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not rayservices()


def fail_pod(emulator: Emulator, name: str) -> None:
    emulator.set_pod("default", name, {"phase": "Failed", "reason": "Error"})


def quarantine_taints(emulator: Emulator, node: str) -> list[Any]:
    taints = emulator.core.read_node(node).spec.taints or []
    return [t for t in taints if t.key == kuberay.QUARANTINE_TAINT]


def test_a_kubernetes_node_where_raypods_pods_keep_failing_is_tainted_for_the_quarantine_then_released(
    db: store.Store, emulator: Emulator, backend: kuberay.KubeRayBackend
) -> None:
    emulator.core.create_node(
        {
            "metadata": {"name": "k8s-node-1"},
            "spec": {"taints": [{"key": "team", "value": "ml", "effect": "NoSchedule"}]},
        }
    )
    emulator.core.create_node({"metadata": {"name": "k8s-node-2"}, "spec": {}})
    spec = SPEC.model_copy(update={"recovery": SPEC.recovery.model_copy(update={"quarantine_s": 6.0})})
    uid = db.insert(spec).uid
    reconciler = loop.Reconciler(db, backend)
    until(reconciler, emulator.rayclusters, "the RayCluster is created")
    kuberay_starts(emulator)
    until(reconciler, lambda: view(db).status.phase is state.ClusterPhase.READY, "Ready")

    fail_pod(emulator, "demo-w-worker-a")
    until(reconciler, lambda: "demo-w-worker-a" not in {p.metadata.name for p in emulator.pods()}, "replaced once")
    assert quarantine_taints(emulator, "k8s-node-1") == [], "one failing pod never taints a shared node"
    emulator.start_pod("default", "demo", "w", "demo-w-worker-c", node="k8s-node-2")  # elsewhere: not counted there
    emulator.run("default", "demo-w-worker-c", ip="10.0.0.4")
    fail_pod(emulator, "demo-w-worker-b")
    until(reconciler, lambda: quarantine_taints(emulator, "k8s-node-1"), "the node of two failures is tainted")
    [taint] = quarantine_taints(emulator, "k8s-node-1")
    assert taint.effect == "NoSchedule" and float(taint.value) > time.time()
    assert [t.key for t in emulator.core.read_node("k8s-node-1").spec.taints] == ["team", kuberay.QUARANTINE_TAINT]
    assert quarantine_taints(emulator, "k8s-node-2") == []

    restarted = kuberay.KubeRayBackend(emulator.api, request_timeout_s=2.0)  # the taint's end is on the node
    try:
        assert restarted.clusters.wait_synced(10) and restarted.pods.wait_synced(10)
        until(
            loop.Reconciler(db, restarted),
            lambda: not quarantine_taints(emulator, "k8s-node-1"),
            "the taint is lifted once the quarantine ends",
            timeout=30,
        )
    finally:
        restarted.close()
    assert [t.key for t in emulator.core.read_node("k8s-node-1").spec.taints] == ["team"], "other taints stay"
    assert uid


def test_a_pod_no_kubernetes_node_can_take_says_why_in_its_nodes_reason() -> None:
    pod = {
        "metadata": {"name": "demo-head-x1", "labels": {"ray.io/node-type": "head"}},
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/3 nodes are available: 3 Insufficient cpu.",
                }
            ],
        },
    }
    [node] = kuberay.observed_nodes([pod]).values()
    assert node.phase is state.NodePhase.STARTING
    assert node.reason == "its pod cannot be scheduled: 0/3 nodes are available: 3 Insufficient cpu."


def test_outside_the_cluster_endpoints_are_trusted_as_the_kubeconfig_trusts_the_api_server(tmp_path: Path) -> None:
    """The API server's proxy, with a CA of its own (as most kubeconfigs have): the system's CAs would refuse it."""
    import ssl
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import httpx
    from kubernetes import client as kube

    from raypod.server import tls

    cert, key = tls.self_signed(tmp_path)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *_args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"https://127.0.0.1:{server.server_address[1]}"
    try:
        trusting = kube.Configuration()
        trusting.host, trusting.ssl_ca_cert = url, str(tls.ca_path(tmp_path))
        made = kuberay.KubeRayBackend(kube.ApiClient(trusting), watch=False)
        assert httpx.get(url, verify=made.upstream_tls("any") or True).text == "ok"
        with pytest.raises(httpx.ConnectError):
            httpx.get(url)  # the system's CAs: what the gateway used before
        skipping = kube.Configuration()
        skipping.host, skipping.verify_ssl = url, False
        insecure = kuberay.KubeRayBackend(kube.ApiClient(skipping), watch=False)
        assert httpx.get(url, verify=insecure.upstream_tls("any") or True).text == "ok"
        inside = kuberay.KubeRayBackend(kube.ApiClient(trusting), in_cluster=True, watch=False)
        assert inside.upstream_tls("any") is None, "in the cluster, services are plain HTTP"
    finally:
        server.shutdown()
        server.server_close()
