"""Shared fixtures: paths to ../shared (absent in a user's clone: tests that need it skip)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def kuberay_crds() -> Path:
    path = SHARED / "kuberay-crds"
    if not (path / "ray.io_rayclusters.yaml").exists():
        pytest.skip("../shared/kuberay-crds is not beside this clone")
    return path
