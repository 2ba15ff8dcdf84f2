"""Attacks through the gateway on a real Ray 2.60 dashboard, with raw TLS sockets (nothing normalises the
requests on the way): no request reaches Ray that its sender may not make, and nothing hangs.

Also: an upload is refused before its body is read, and a job's log follow survives a host kept busy."""

from __future__ import annotations

import hashlib
import os
import re
import socket
import ssl
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from raypod import state
from raypod.backends.local import NODE_VARIABLES
from raypod.capabilities.hangwatch import layout as hangwatch_layout
from raypod.client._http import tls_verify
from tests.e2e.conftest import RaypodServer
from tests.e2e.test_gateway import ray_cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
CLUSTER = "/clusters/default/shared"


@pytest.fixture(scope="module")
def viewer(raypod_server: RaypodServer) -> str:
    with raypod_server.client() as api:
        api.users.create("sec-viewer", team="default")
        return api.tokens.create("sec", user="sec-viewer").token


def raw(server: RaypodServer, payload: bytes, wait_s: float = 8.0) -> list[int]:
    """Send bytes on one TLS connection and return the status of every response read until it goes quiet."""
    context = ssl.create_default_context(cafile=server.ca_file)
    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=wait_s) as plain,
        context.wrap_socket(plain, server_hostname="127.0.0.1") as sock,
    ):
        sock.sendall(payload)
        received = b""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except (TimeoutError, ssl.SSLError, OSError):
                break
            if not chunk:
                break
            received += chunk
            sock.settimeout(max(0.1, min(2.0, deadline - time.monotonic())))
    return [int(code) for code in re.findall(rb"HTTP/1\.1 (\d{3}) ", received)]


def ray_jobs(server: RaypodServer) -> list[str]:
    """Entrypoints of every job Ray has, asked through the gateway as the admin."""
    answer = httpx.get(
        f"{server.url}{CLUSTER}/api/jobs/",
        headers={"Authorization": f"Bearer {server.admin_token}"},
        verify=tls_verify(server.ca_file),
        timeout=30,
    )
    answer.raise_for_status()
    return [str(job.get("entrypoint")) for job in answer.json()]


def smuggled_post() -> bytes:
    body = b'{"entrypoint": "echo smuggled-by-a-viewer"}'
    return (
        b"POST " + CLUSTER.encode() + b"/api/jobs/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


def request(method: str, path: str, token: str, extra: bytes = b"", body: bytes = b"") -> bytes:
    return (
        f"{method} {CLUSTER}{path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n".encode()
        + extra
        + b"\r\n"
        + body
    )


def test_a_get_with_a_body_cannot_smuggle_an_owner_request(
    raypod_server: RaypodServer, shared_cluster: state.ClusterView, viewer: str
) -> None:
    inner = smuggled_post()
    attack = request("GET", "/api/version", viewer, f"Content-Length: {len(inner)}\r\n".encode(), inner)
    follow_up = request("GET", "/api/version", viewer)
    statuses = raw(raypod_server, attack + follow_up)
    assert statuses[:1] == [400], statuses
    assert not any("smuggled" in entry for entry in ray_jobs(raypod_server))


def test_an_options_request_with_a_body_is_refused(
    raypod_server: RaypodServer, shared_cluster: state.ClusterView, viewer: str
) -> None:
    inner = smuggled_post()
    attack = request("OPTIONS", "/api/jobs/", viewer, f"Content-Length: {len(inner)}\r\n".encode(), inner)
    assert raw(raypod_server, attack)[:1] == [400]
    assert not any("smuggled" in entry for entry in ray_jobs(raypod_server))


def test_content_length_with_transfer_encoding_is_refused(
    raypod_server: RaypodServer, shared_cluster: state.ClusterView, viewer: str
) -> None:
    inner = smuggled_post()
    chunked = f"{len(inner):x}\r\n".encode() + inner + b"\r\n0\r\n\r\n"
    headers = b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n"
    statuses = raw(raypod_server, request("GET", "/api/version", viewer, headers, chunked))
    assert statuses and statuses[0] == 400, statuses
    assert not any("smuggled" in entry for entry in ray_jobs(raypod_server))


def test_duplicate_content_lengths_are_refused(
    raypod_server: RaypodServer, shared_cluster: state.ClusterView, viewer: str
) -> None:
    headers = b"Content-Length: 0\r\nContent-Length: 40\r\n"
    statuses = raw(raypod_server, request("POST", "/api/jobs/", raypod_server.admin_token, headers, b"x" * 40))
    assert statuses and statuses[0] == 400, statuses


def test_pipelined_requests_are_each_authorized(
    raypod_server: RaypodServer, shared_cluster: state.ClusterView, viewer: str
) -> None:
    body = b'{"entrypoint": "echo pipelined-by-a-viewer"}'
    post = request(
        "POST",
        "/api/jobs/",
        viewer,
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n".encode(),
        body,
    )
    statuses = raw(
        raypod_server, request("GET", "/api/version", viewer) + post + request("GET", "/api/version", viewer)
    )
    assert statuses == [200, 403, 200], statuses
    assert not any("pipelined" in entry for entry in ray_jobs(raypod_server))


def test_an_upload_without_rights_is_answered_before_its_body_is_read(
    raypod_server: RaypodServer, shared_cluster: state.ClusterView, viewer: str
) -> None:
    """90 MB declared (under the cap), a few bytes sent: the 403 comes back without the server waiting for the
    rest; 300 MB declared (over it) is 413 at once, whoever sends it."""

    def head(token: str, size: int) -> bytes:
        return (
            "POST /api/v1/namespaces/default/clusters/shared/working-dirs HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: multipart/form-data; boundary=b\r\n"
            f"Content-Length: {size}\r\n\r\n--b\r\n"
        ).encode()

    started = time.monotonic()
    assert raw(raypod_server, head(viewer, 90 * 2**20), wait_s=10)[:1] == [403]
    assert raw(raypod_server, head(raypod_server.admin_token, 300 * 2**20), wait_s=10)[:1] == [413]
    assert time.monotonic() - started < 15


def test_a_followed_job_log_survives_a_busy_host(
    raypod_server: RaypodServer, shared_cluster: state.ClusterView, tmp_path: Path
) -> None:
    """Both cores saturated for 15 s (three of the test server's 5 s websocket pings, whose pongs come late) while
    `ray job submit` follows the log through the gateway's websocket. (30 s and six pings until stop 42: the other
    test process shares the two cores meanwhile, so the suite paid for it twice.)"""
    (tmp_path / "busy.py").write_text(
        "import multiprocessing, time\n"
        "def spin(seconds):\n"
        "    end = time.time() + seconds\n"
        "    while time.time() < end:\n"
        "        pass\n"
        "if __name__ == '__main__':\n"
        "    workers = [multiprocessing.Process(target=spin, args=(15,)) for _ in range(2)]\n"
        "    [w.start() for w in workers]\n"
        "    for tick in range(3):\n"
        "        print('tick', tick, flush=True)\n"
        "        time.sleep(5)\n"
        "    [w.join() for w in workers]\n"
        "    print('the-final-line', flush=True)\n"
    )
    result = ray_cli(
        raypod_server,
        "job",
        "submit",
        "--address",
        "raypod://shared",
        "--working-dir",
        str(tmp_path),
        "--",
        "python",
        "busy.py",
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "the-final-line" in result.stdout
    assert "1006" not in result.stdout + result.stderr


@pytest.mark.skipif(
    os.geteuid() != 0, reason="file isolation of the local backend needs a server running as root (docs/security.md)"
)
def test_a_job_cannot_read_raypods_secrets_or_another_clusters_files_or_reach_its_ray(
    raypod_server: RaypodServer, shared_cluster: state.ClusterView, tmp_path: Path
) -> None:
    """A job on one cluster tries to read the credentials file, the database, raypod's token files and another
    cluster's session directory, and to call another cluster's dashboard with the token it holds: all denied.
    Its environment holds its own cluster's Ray token only, and no raypod secret."""
    with raypod_server.client() as api:
        api.clusters.create({"name": "sec-other", "head": {"memory": "512Mi", "object_store_memory": "80Mi"}})
        other = api.clusters.wait_ready("sec-other", timeout=180)
        info = api.info()
    try:
        assert info.isolated, f"this host should isolate nodes (root, util-linux): {info.tenancy}"
        other_dir = Path(tempfile.gettempdir()) / f"rp-{other.uid[:10]}"
        assert other_dir.is_dir()
        targets = [
            raypod_server.home / "credentials",
            raypod_server.home / "raypod.db",
            raypod_server.home / "local" / other.uid / "ray-auth-token",
            raypod_server.home / "local" / shared_cluster.uid / "ray-auth-token",
            other_dir,
        ]
        (tmp_path / "probe.py").write_text(
            "import hashlib, os, sys, urllib.request, urllib.error\n"
            "token = os.environ.get('RAY_AUTH_TOKEN', '')\n"
            "print('token-sha', hashlib.sha256(token.encode()).hexdigest())\n"
            "print('raypod-vars', sorted(k for k in os.environ if k.startswith('RAYPOD_') and k not in "
            f"{(*NODE_VARIABLES, hangwatch_layout.DIR_VARIABLE)!r}))\n"
            "for path in sys.argv[2:]:\n"
            "    try:\n"
            "        found = os.listdir(path) if os.path.isdir(path) else open(path, 'rb').read(16)\n"
            "        print('read', path, 'ALLOWED', found)\n"
            "    except OSError as exc:\n"
            "        print('read', path, 'denied', type(exc).__name__)\n"
            "headers = {'Authorization': 'Bearer ' + token}\n"
            "request = urllib.request.Request(sys.argv[1] + '/api/jobs/', headers=headers)\n"
            "try:\n"
            "    print('other-dashboard', urllib.request.urlopen(request, timeout=10).status)\n"
            "except urllib.error.HTTPError as exc:\n"
            "    print('other-dashboard', exc.code)\n"
        )
        result = ray_cli(
            raypod_server,
            "job",
            "submit",
            "--address",
            "raypod://shared",
            "--working-dir",
            str(tmp_path),
            "--",
            "python",
            "probe.py",
            other.status.endpoints["dashboard"],
            *map(str, targets),
        )
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        own = hashlib.sha256(raypod_server.ray_token(shared_cluster.uid).encode()).hexdigest()
        theirs = hashlib.sha256(raypod_server.ray_token(other.uid).encode()).hexdigest()
        assert f"token-sha {own}" in result.stdout and theirs not in result.stdout
        assert "raypod-vars []" in result.stdout
        reads = [line for line in result.stdout.splitlines() if line.startswith("read ")]
        assert len(reads) == len(targets) and all(" denied " in line for line in reads), reads
        refused = [line for line in result.stdout.splitlines() if line.startswith("other-dashboard")]
        assert refused in (["other-dashboard 401"], ["other-dashboard 403"]), refused  # Ray: 403 for a wrong token
    finally:
        with raypod_server.client() as api:
            api.clusters.delete("sec-other")
