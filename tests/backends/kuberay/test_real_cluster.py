"""Against a real Kubernetes cluster with the KubeRay operator, when ``KUBECONFIG`` names one (none can run on
raypod's CI machines, so this is skipped there): a small cluster becomes Ready from KubeRay's own pods, scales,
and is deleted. Set ``RAYPOD_TEST_K8S_NAMESPACE`` (default ``default``) to the namespace to use."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from raypod import spec as spec_mod
from raypod import state
from raypod.controlplane import loop, store

pytestmark = pytest.mark.skipif(
    not os.environ.get("KUBECONFIG"),
    reason="no real Kubernetes cluster here: set KUBECONFIG (with the KubeRay operator installed) to run these",
)


def test_a_small_cluster_comes_up_scales_and_goes_on_a_real_kuberay(tmp_path: Path) -> None:
    from raypod.backends.kuberay.backend import KubeRayBackend

    namespace = os.environ.get("RAYPOD_TEST_K8S_NAMESPACE", "default")
    spec = spec_mod.parse_spec(
        {
            "name": f"raypod-test-{int(time.time()) % 100000}",
            "namespace": namespace,
            "head": {"cpus": 1, "memory": "2Gi"},
            "worker_groups": [{"name": "w", "replicas": 1, "cpus": 1, "memory": "1Gi"}],
        }
    )
    db = store.Store(f"sqlite:///{tmp_path / 'raypod.db'}")
    backend = KubeRayBackend.from_environment()
    reconciler = loop.Reconciler(db, backend)
    uid = db.insert(spec).uid

    def until(done: Callable[[], Any], what: str, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, f"never happened: {what}"
            reconciler.reconcile_all()
            time.sleep(2)

    def phase() -> state.ClusterPhase:
        return db.get(namespace, spec.name).status.phase

    try:
        until(lambda: phase() is state.ClusterPhase.READY, "Ready")
        db.update_spec(uid, spec.with_replicas("w", 2))
        until(lambda: db.get(namespace, spec.name).status.ready_nodes == 3, "3 nodes")
    finally:
        db.mark_deleting(uid)
        until(lambda: not db.list(namespace), "deleted", timeout=300)
        backend.close()
