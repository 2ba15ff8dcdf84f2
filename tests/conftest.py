"""Shared fixtures: the KubeRay CRDs kept in the repository (a user's clone validates manifests too)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
KUBERAY_CRDS = REPO / "src" / "raypod" / "backends" / "kuberay" / "crds"
KUBERAY_VERSION = "v1.7.0"


@pytest.fixture(scope="session")
def kuberay_crds() -> Path:
    assert (KUBERAY_CRDS / "ray.io_rayclusters.yaml").exists(), f"KubeRay {KUBERAY_VERSION} CRDs missing"
    return KUBERAY_CRDS
