"""An agent in a pod reports over HTTP: what it writes reaches the control plane once the control plane answers,
and each of the control plane's requests (a hang to cancel) reaches the agent once, across an outage between
the two. The server in-process (FastAPI's TestClient is an httpx.Client); the outage a port nobody listens on."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from raypod import config, untrusted_files
from raypod.backends import base
from raypod.backends.fake import FakeBackend
from raypod.capabilities.hangwatch import layout
from raypod.capabilities.hangwatch.report import Reporter
from raypod.server.app import create_app


@pytest.fixture
def api(tmp_path: Path) -> Iterator[TestClient]:
    pods = FakeBackend(features=frozenset({base.Feature.HANGWATCH}))  # no directory shared with the server
    settings = config.Settings(home=tmp_path / "home", reconcile_interval_s=0.05, tls=False)
    with TestClient(create_app(settings, backend=pods), raise_server_exceptions=False) as client:
        token = json.loads((tmp_path / "home" / "credentials").read_text())["token"]
        client.post("/api/v1/clusters", json={"name": "hw"}, headers={"Authorization": f"Bearer {token}"})
        yield client


def uid(api: TestClient) -> str:
    """The cluster's: the reports of clusters that are gone are forgotten."""
    found: str = api.app.state.control_plane.store.get("default", "hw").uid  # type: ignore[attr-defined]
    return found


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_requests_and_detections_cross_an_outage_once_each(api: TestClient, tmp_path: Path) -> None:
    reports = api.app.state.control_plane.hangs.reports  # type: ignore[attr-defined]
    token = reports.token(uid(api))
    reporter = Reporter(tmp_path / "agent", "/api/v1/hangwatch/agents/pod-a", token)
    reporter._client = api
    mirror = reports.root / uid(api) / "pod-a"

    assert reporter.report() == 0
    untrusted_files.write_json(mirror, "requests/hang-1.json", {"run_id": "r", "action": "cancel"})
    assert reporter.report() == 1 and reporter.report() == 0, "a request is handed over once"
    assert layout.read_json(tmp_path / "agent" / "requests" / "hang-1.json") == {"run_id": "r", "action": "cancel"}

    untrusted_files.write_json(mirror, "requests/hang-2.json", {"run_id": "r", "action": "fail-job"})
    layout.write_json(layout.detections_dir(reporter.root) / "d.json", {"run_id": "r", "kind": "hang"})
    reporter._client = httpx.Client(base_url=f"http://127.0.0.1:{closed_port()}", timeout=1)  # the outage
    assert reporter.report() == 0
    assert (mirror / "requests" / "hang-2.json").exists(), "a request the agent did not get waits for it"
    assert not (mirror / "detections" / "d.json").exists()
    reporter._client = api
    assert reporter.report() == 1 and reporter.report() == 0
    assert json.loads((mirror / "detections" / "d.json").read_text()) == {"run_id": "r", "kind": "hang"}


def test_a_clusters_credential_reports_for_that_cluster_only(api: TestClient) -> None:
    reports = api.app.state.control_plane.hangs.reports  # type: ignore[attr-defined]
    theirs = reports.token(uid(api))
    answer = api.post(
        "/api/v1/hangwatch/agents/pod-a",
        json={"status": {"time": 1}},
        headers={"Authorization": f"Bearer {theirs}"},
    )
    assert answer.status_code == 200
    assert set(reports.dirs(uid(api))) == {"pod-a"} and reports.dirs("another-uid") == {}
    assert (reports.root.parent / "hangwatch-agent.key").stat().st_mode & 0o777 == 0o600


def test_two_threads_making_the_key_at_once_agree_on_it(tmp_path: Path) -> None:
    """On a first start the reconciler (making nodes' add-ons) and a request ask for credentials at once: both
    must get the same key, never one half written (CI saw a credential refused that way)."""
    import threading

    from raypod.controlplane.hangwatch import AgentReports

    for attempt in range(50):
        reports = [AgentReports(tmp_path / str(attempt)), AgentReports(tmp_path / str(attempt))]
        barrier = threading.Barrier(2)
        tokens: list[str] = []

        def ask(which: AgentReports, barrier: threading.Barrier, tokens: list[str]) -> None:
            barrier.wait()
            tokens.append(which.token("uid-1"))

        threads = [threading.Thread(target=ask, args=(which, barrier, tokens)) for which in reports]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert tokens[0] == tokens[1], f"attempt {attempt}"
        assert reports[1].cluster_of(tokens[0]) == "uid-1"


def test_a_job_holding_its_agents_credential_cannot_fill_the_servers_disk(
    api: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job in a pod can read its agent's credential (same user, one process namespace): what it can make the
    server keep is bounded, by node and by detection."""
    from raypod.controlplane import hangwatch

    monkeypatch.setattr(hangwatch, "MAX_REPORTING_NODES", 3)
    monkeypatch.setattr(hangwatch, "MAX_KEPT_DETECTIONS", 4)
    reports = api.app.state.control_plane.hangs.reports  # type: ignore[attr-defined]
    headers = {"Authorization": f"Bearer {reports.token(uid(api))}"}

    def report(node: str, names: range) -> int:
        body = {"detections": {f"d{i}.json": {"run_id": "r"} for i in names}}
        return api.post(f"/api/v1/hangwatch/agents/{node}", json=body, headers=headers).status_code

    assert [report(f"pod-{i}", range(0)) for i in range(4)] == [200, 200, 200, 429]
    assert report("pod-0", range(4)) == 200 and report("pod-0", range(2)) == 200, "the same files again"
    assert report("pod-0", range(4, 5)) == 429
    assert len(list((reports.root / uid(api) / "pod-0" / "detections").iterdir())) == 4
