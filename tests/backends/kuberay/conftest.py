"""An emulated Kubernetes API server (kmock: no real one can run here) in a background thread, reached through a
TCP relay that a test can cut to play an API server outage, and helpers that play KubeRay's part on pods."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import threading
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import kmock
import pytest
from kubernetes import client

RESOURCES = {
    "v1/pods": {
        "namespaced": True,
        "kind": "Pod",
        "singular": "pod",
        "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
        "shortnames": ["po"],
        "categories": [],
        "subresources": ["status"],
    },
    "v1/secrets": {
        "namespaced": True,
        "kind": "Secret",
        "singular": "secret",
        "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
        "shortnames": [],
        "categories": [],
        "subresources": [],
    },
    **{
        f"{group_version}/{plural}": {
            "namespaced": True,
            "kind": kind,
            "singular": kind.lower(),
            "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
            "shortnames": [],
            "categories": [],
            "subresources": [],
        }
        for group_version, plural, kind in (
            ("v1", "configmaps", "ConfigMap"),
            ("v1", "services", "Service"),
            ("v1", "persistentvolumeclaims", "PersistentVolumeClaim"),
            ("apps/v1", "deployments", "Deployment"),
            ("networking.k8s.io/v1", "networkpolicies", "NetworkPolicy"),
        )
    },
    "v1/nodes": {
        "namespaced": False,
        "kind": "Node",
        "singular": "node",
        "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
        "shortnames": ["no"],
        "categories": [],
        "subresources": ["status"],
    },
    "ray.io/v1/rayservices": {
        "namespaced": True,
        "kind": "RayService",
        "singular": "rayservice",
        "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
        "shortnames": [],
        "categories": [],
        "subresources": ["status"],
    },
    "ray.io/v1/rayclusters": {
        "namespaced": True,
        "kind": "RayCluster",
        "singular": "raycluster",
        "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
        "shortnames": [],
        "categories": [],
        "subresources": ["status"],
    },
}


class Relay:
    """A TCP relay to the emulator; ``cut()`` drops every connection and refuses new ones until ``restore()``."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.is_cut = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        self.is_cut.set()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._sockets.clear()

    def close(self) -> None:
        self.cut()
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()

    def restore(self) -> None:
        self.is_cut.clear()

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self.listener.accept()
            except OSError:
                return  # closed
            if self.is_cut.is_set():
                downstream.close()
                continue
            try:
                upstream = socket.create_connection(self.upstream)
            except OSError:
                downstream.close()
                continue
            with self._lock:
                self._sockets += [downstream, upstream]
            for source, target in ((downstream, upstream), (upstream, downstream)):
                threading.Thread(target=self._pipe, args=(source, target), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, target: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                target.sendall(data)
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_WR)


class Emulator:
    def __init__(self, handler: Any, url: str, loop: asyncio.AbstractEventLoop) -> None:
        self.handler, self.url, self.loop = handler, url, loop
        host, port = url.removeprefix("http://").rstrip("/").split(":")
        self.relay = Relay((host, int(port)))
        configuration = client.Configuration()
        configuration.host = f"http://127.0.0.1:{self.relay.port}"
        self.api = client.ApiClient(configuration)  # through the relay: what the backend uses
        direct = client.Configuration()
        direct.host = url.rstrip("/")
        self.core = client.CoreV1Api(client.ApiClient(direct))  # the test's own hand (KubeRay's), never cut
        self.custom = client.CustomObjectsApi(client.ApiClient(direct))

    def rayclusters(self) -> list[dict[str, Any]]:
        return list(self.custom.list_cluster_custom_object("ray.io", "v1", "rayclusters")["items"])

    def pods(self, namespace: str = "default") -> list[Any]:
        return list(self.core.list_namespaced_pod(namespace).items)

    def start_pod(
        self, namespace: str, cluster: str, group: str, name: str, *, head: bool = False, node: str = "k8s-node-1"
    ) -> None:
        """What KubeRay does for a replica: a pod labelled as its, Pending, scheduled on Kubernetes node ``node``."""
        labels = {
            "ray.io/cluster": cluster,
            "ray.io/group": "headgroup" if head else group,
            "ray.io/node-type": "head" if head else "worker",
            "ray.io/is-ray-node": "yes",
        }
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": labels,
                "uid": f"uid-{name}",
                "creationTimestamp": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
            },
            "spec": {"containers": [{"name": "ray", "image": "rayproject/ray"}], "nodeName": node},
            "status": {"phase": "Pending"},
        }
        self.core.create_namespaced_pod(namespace, body)

    def set_pod(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.core.patch_namespaced_pod(name, namespace, {"status": status})

    def run(self, namespace: str, name: str, ip: str = "10.0.0.1") -> None:
        self.set_pod(
            namespace, name, {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]}
        )


@pytest.fixture
def emulator(request: pytest.FixtureRequest) -> Iterator[Emulator]:
    """kmock's Kubernetes emulator; ``@pytest.mark.parametrize('emulator', [{'crds': False}], indirect=True)``
    leaves KubeRay's CRD out, as on a cluster without the operator."""
    with_crds = getattr(request, "param", {}).get("crds", True)
    ready = threading.Event()
    box: dict[str, Any] = {}
    stop: asyncio.Event | None = None

    def serve() -> None:
        nonlocal stop
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)

        async def main() -> None:
            nonlocal stop
            stop = asyncio.Event()
            async with kmock.KubernetesEmulator() as handler, kmock.Server(handler) as server:
                for key, value in RESOURCES.items():
                    if with_crds or not key.startswith("ray.io/"):
                        handler.resources[key] = value
                box.update(handler=handler, url=str(server.url), loop=loop)
                ready.set()
                await stop.wait()

        loop.run_until_complete(main())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(30), "the emulator did not start"
    emulated = Emulator(box["handler"], box["url"], box["loop"])
    yield emulated
    emulated.relay.close()
    for api in (emulated.api, emulated.core.api_client, emulated.custom.api_client):
        api.close()
    box["loop"].call_soon_threadsafe(stop.set)  # type: ignore[union-attr]
    thread.join(timeout=10)
    # Sockets the relay cut mid-response are reclaimed here, inside this test, not in whichever test runs next.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gc.collect()
