"""A real raypod server process with the local backend: real `ray start` nodes, real HTTP.

Every process started here is stopped at the end, including Ray nodes left behind by a failed test.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import psutil
import pytest

from raypod import state
from raypod.backends import local
from raypod.client import Client
from raypod.client._http import tls_verify
from raypod.testing import free_port
from tests.conftest import REPO

CHROMIUM = os.environ.get("RAYPOD_TEST_CHROMIUM", "/usr/bin/chromium")
BROWSER_ARTIFACTS = Path(os.environ.get("RAYPOD_TEST_ARTIFACTS", REPO / "test-artifacts"))
# CI sets RAYPOD_REQUIRE_BROWSER=1, so a missing browser fails there instead of skipping.
BROWSER_MISSING = not Path(CHROMIUM).exists() and not os.environ.get("RAYPOD_REQUIRE_BROWSER")


@dataclass
class RaypodServer:
    home: Path
    port: int
    process: subprocess.Popen[bytes] | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    oidc: Any = None  # tests.sso.provider.OidcProvider, when the server signs users in with it
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.home / "server.log"

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """What a user's shell on this machine has: the server and its home (credentials file inside)."""
        return {
            **{k: v for k, v in os.environ.items() if not k.startswith(("RAYPOD_", "RAY_"))},
            "RAYPOD_HOME": str(self.home),
            "RAYPOD_SERVER": self.url,
            "RAYPOD_RECONCILE_INTERVAL_S": "0.5",
            "RAYPOD_DRAIN_TIMEOUT_S": "30",
            # Websocket keepalive pings every 5 s (30 s in production): a busy-host test outlasts several of them
            # in seconds rather than minutes.
            "RAYPOD_WS_PING_INTERVAL_S": "5",
            **self.extra_env,
        }

    @property
    def admin_token(self) -> str:
        return str(json.loads((self.home / "credentials").read_text())["token"])

    @property
    def ca_file(self) -> str:
        return str(self.home / "tls" / "ca.crt")

    def ray_token(self, cluster_uid: str) -> str:
        """A cluster's own Ray token: tests that talk to Ray directly need it, users never do."""
        return (self.home / "local" / cluster_uid / "ray-auth-token").read_text().strip()

    def start(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "raypod", "server", "--port", str(self.port)],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with httpx.Client(verify=False) as probe:
                    probe.get(f"{self.url}/healthz").raise_for_status()
                return
            except Exception:
                time.sleep(0.2)
        raise RuntimeError(f"raypod server did not start:\n{self.log.read_text()[-3000:]}")

    def kill9(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def client(self, token: str | None = None) -> Client:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("RAYPOD_CA_FILE", self.ca_file)
            return Client(self.url, timeout=60, token=token or self.admin_token)

    def reconcile_passes(self) -> float:
        """How many reconcile passes this server process has finished (its own metric)."""
        with httpx.Client(verify=tls_verify(self.ca_file)) as http:
            text = http.get(f"{self.url}/metrics", headers={"Authorization": f"Bearer {self.admin_token}"}).text
        line = next(li for li in text.splitlines() if li.startswith("raypod_reconcile_duration_seconds_count"))
        return float(line.split()[-1])

    def wait_for_passes(self, count: int, timeout: float = 60) -> None:
        """Wait until ``count`` more reconcile passes finished: the witness that something would have happened by
        now if the loop were going to do it (instead of a sleep)."""
        target = self.reconcile_passes() + count
        wait_until(lambda: self.reconcile_passes() >= target, f"{count} reconcile passes", timeout)


def cluster_processes(cluster_id: str | None = None) -> list[psutil.Process]:
    """Live (non-zombie) processes that carry a raypod cluster marker."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                continue
            marker = process.environ().get(local.CLUSTER_MARKER)
        except (psutil.Error, OSError):
            continue
        if marker and (cluster_id is None or marker == cluster_id):
            found.append(process)
    return found


def driver_env(server: RaypodServer, view: state.ClusterView) -> dict[str, str]:
    """The environment of a Ray driver on this host connected to the cluster's GCS with its own token."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(
        {
            "RAY_ADDRESS": view.status.endpoints["gcs"],
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": server.ray_token(view.uid),
        }
    )
    return env


def run_driver(server: RaypodServer, view: state.ClusterView, code: str, timeout: float = 120) -> str:
    """Run a Ray driver in a fresh interpreter against a cluster and return its stdout."""
    env = driver_env(server, view)
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's chromium, headless, driven by Playwright (a module per launch)."""
    playwright_sync = pytest.importorskip("playwright.sync_api")
    with playwright_sync.sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            # This machine has no network beyond loopback: keep Chromium from trying to phone home.
            args=["--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"],
        )
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    # The server's certificate is self-signed and made at first start; the browser is told to accept it.
    context = browser.new_context(ignore_https_errors=True, viewport={"width": 1366, "height": 900})
    context.set_default_timeout(30_000)
    opened = context.new_page()
    yield opened
    context.close()


def log_in(page: Any, server: RaypodServer, path: str = "/") -> None:
    page.goto(f"{server.url}/login?next={path}")
    page.get_by_label("API token").fill(server.admin_token)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{server.url}{path}")


@contextlib.contextmanager
def module_server(
    factory: pytest.TempPathFactory, name: str, extra_env: dict[str, str] | None = None
) -> Iterator[RaypodServer]:
    """A server for a test module; every cluster it still has is deleted (and waited for) before it stops."""
    started = RaypodServer(factory.mktemp(name), free_port(), extra_env=dict(extra_env or {}))
    started.start()
    try:
        yield started
    finally:
        with started.client() as api:
            for view in api.clusters.list():
                api.clusters.delete(view.spec.name, view.spec.namespace)
            for view in api.clusters.list():
                api.clusters.wait_deleted(view.spec.name, view.spec.namespace, timeout=120)
        started.stop()


def wait_until(check: Callable[[], Any], what: str, timeout: float = 120) -> Any:
    """``check()``'s first truthy answer, asked every 0.2 s; fails the test past ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def undisturbed_training_weights(steps: int) -> list[list[float]]:
    """What an undisturbed ``resilient_train_script.py`` run of ``steps`` steps ends with, computed in this process
    by the script's own functions: the baseline a disturbed run must match, without a Ray Train run of its own."""
    return _script_module("resilient_train_script").undisturbed_weights(steps)  # type: ignore[no-any-return]


def _script_module(name: str) -> ModuleType:
    path = Path(__file__).parent / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"raypod_test_scripts.{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_same_weights(found: list[list[float]], expected: list[list[float]]) -> None:
    """Equal up to float32 rounding: a missed, repeated or lost step moves weights by about 1e-2."""
    assert len(found) == len(expected)
    for got, want in zip(found, expected, strict=True):
        assert got == pytest.approx(want, rel=1e-5, abs=1e-6), "a disturbed run must end where an undisturbed one does"
