"""Plain Ray tooling through raypod's gateway, against a real cluster: `ray job submit --address raypod://...`
with a large working dir, log tailing to the end, JobSubmissionClient, owner-only submission, and Ray's own
ports refusing requests without the cluster's token."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import pytest

from raypod import errors, state
from raypod.client import Client
from raypod.client._http import tls_verify
from tests.e2e.conftest import RaypodServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def run_cli(
    server: RaypodServer, program: str, *args: str, token: str | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a console script of this environment as a user of ``server`` would (credentials from its home)."""
    env = {k: v for k, v in server.env.items() if not k.startswith("RAY_")}
    if token:
        env["RAYPOD_TOKEN"] = token
    return subprocess.run(
        [str(Path(sys.executable).parent / program), *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def ray_cli(
    server: RaypodServer, *args: str, token: str | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return run_cli(server, "ray", *args, token=token, cwd=cwd)


def test_vanilla_ray_job_submit_uploads_a_large_working_dir_and_follows_logs(
    raypod_server: RaypodServer, shared_cluster: state.ClusterView, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "blob.bin").write_bytes(os.urandom(55 * 2**20))  # incompressible: the upload really is > 50 MB
    (work / "job.py").write_text(
        "import os, time\n"
        "print('size', os.path.getsize('blob.bin'), flush=True)\n"
        "for i in range(3):\n"
        "    print('tick', i, flush=True)\n"
        "    time.sleep(1)\n"
        "print('the-last-line', flush=True)\n"
    )
    result = ray_cli(
        raypod_server,
        "job",
        "submit",
        "--address",
        "raypod://shared",
        "--working-dir",
        ".",
        "--",
        "python",
        "job.py",
        cwd=work,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout + result.stderr
    assert f"size {55 * 2**20}" in out
    assert "tick 2" in out and "the-last-line" in out
    assert "succeeded" in out


def test_job_submission_client_and_job_list_work_with_namespaced_addresses(
    raypod_server: RaypodServer, shared_cluster: state.ClusterView
) -> None:
    code = (
        "from ray.job_submission import JobSubmissionClient\n"
        "client = JobSubmissionClient('raypod://shared/default')\n"
        "job = client.submit_job(entrypoint='echo via-sdk')\n"
        "import time\n"
        "while client.get_job_status(job).is_terminal() is False: time.sleep(0.5)\n"
        "print(client.get_job_status(job), client.get_job_logs(job).strip())\n"
    )
    env = {k: v for k, v in raypod_server.env.items() if not k.startswith("RAY_")}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("SUCCEEDED") and "via-sdk" in result.stdout
    listed = ray_cli(raypod_server, "job", "list", "--address", "raypod://shared")
    assert listed.returncode == 0 and "via-sdk" in listed.stdout + listed.stderr


def test_clear_errors_for_unknown_clusters_and_bad_credentials(
    raypod_server: RaypodServer, shared_cluster: state.ClusterView
) -> None:
    unknown = ray_cli(raypod_server, "job", "list", "--address", "raypod://nope")
    assert unknown.returncode != 0 and "cluster 'nope' not found" in unknown.stderr
    assert "Traceback" not in unknown.stderr
    bad = ray_cli(raypod_server, "job", "list", "--address", "raypod://shared", token="rpt_000000000000_wrong")
    assert bad.returncode != 0 and "unknown token" in bad.stderr


def test_only_the_owner_or_team_admins_may_submit(
    raypod_server: RaypodServer, shared_cluster: state.ClusterView
) -> None:
    with raypod_server.client() as admin:
        admin.request("POST", "/api/v1/users", json={"name": "bob", "team": "default", "role": "member"})
        bob_token = admin.request("POST", "/api/v1/tokens", json={"user": "bob", "name": "t"})["token"]
    with raypod_server.client(bob_token) as bob:
        assert bob.clusters.get("shared").spec.owner == "admin"
        with pytest.raises(errors.Forbidden, match="only the cluster owner"):
            bob.clusters.scale("shared", "x", 1)
    listed = ray_cli(raypod_server, "job", "list", "--address", "raypod://shared", token=bob_token)
    assert listed.returncode == 0, listed.stderr[-2000:]
    submitted = ray_cli(
        raypod_server, "job", "submit", "--address", "raypod://shared", "--", "echo", "hi", token=bob_token
    )
    assert submitted.returncode != 0
    assert "403" in submitted.stderr or "only the cluster owner" in submitted.stderr


def test_ray_itself_refuses_requests_without_the_cluster_token(
    raypod_server: RaypodServer, shared_cluster: state.ClusterView
) -> None:
    dashboard = shared_cluster.status.endpoints["dashboard"]
    assert httpx.get(f"{dashboard}/api/jobs/").status_code == 401
    headers = {"Authorization": f"Bearer {raypod_server.ray_token(shared_cluster.uid)}"}
    assert httpx.get(f"{dashboard}/api/jobs/", headers=headers).status_code == 200


def test_gateway_needs_credentials(raypod_server: RaypodServer, shared_cluster: state.ClusterView) -> None:
    url = f"{raypod_server.url}/clusters/default/shared/api/jobs/"
    assert httpx.get(url, verify=tls_verify(raypod_server.ca_file)).status_code == 401
    ok = httpx.get(
        url, verify=tls_verify(raypod_server.ca_file), headers={"Authorization": f"Bearer {raypod_server.admin_token}"}
    )
    assert ok.status_code == 200


def test_tokens_never_reach_the_logs(raypod_server: RaypodServer, shared_cluster: state.ClusterView) -> None:
    secrets = [
        raypod_server.admin_token,
        raypod_server.admin_token.split("_", 2)[2],
        raypod_server.ray_token(shared_cluster.uid),
    ]
    # The local backend's Ray temp dir is under tempfile.gettempdir() (TMPDIR), not necessarily /tmp.
    ray_logs = list(Path(tempfile.gettempdir()).glob(f"rp-{shared_cluster.uid[:10]}/**/*.log"))
    assert len(ray_logs) >= 5, "the cluster's Ray logs were not found: nothing would be checked"
    logs = [raypod_server.log, *ray_logs]
    for path in logs:
        text = path.read_text(errors="replace")
        for secret in secrets:
            assert secret not in text, f"a secret appears in {path}"


def test_credentials_file_is_private(raypod_server: RaypodServer, shared_cluster: state.ClusterView) -> None:
    assert (raypod_server.home / "credentials").stat().st_mode & 0o777 == 0o600
    assert (raypod_server.home / "tls" / "server.key").stat().st_mode & 0o777 == 0o600
    token = raypod_server.home / "local" / shared_cluster.uid / "ray-auth-token"
    assert token.stat().st_mode & 0o777 == 0o600
    with (
        httpx.Client(base_url=raypod_server.url, verify=False) as http,
        Client(raypod_server.url, token="rpt_x_y", http=http) as client,
        pytest.raises(errors.Unauthenticated),
    ):
        client.clusters.list()


def raypod_cli(server: RaypodServer, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli(server, "raypod", *args, cwd=cwd)


def test_raypod_job_retries_a_failed_job_and_keeps_its_attempts(
    raypod_server: RaypodServer, shared_cluster: state.ClusterView, tmp_path: Path
) -> None:
    # The node's own /tmp: attempts on the head share it (a sandboxed node does not see the host's /tmp).
    counter = f"/tmp/raypod-flaky-{uuid.uuid4().hex}"
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "flaky.py").write_text(
        "import os, sys\n"
        f"path = {counter!r}\n"
        "n = int(open(path).read()) + 1 if os.path.exists(path) else 1\n"
        "open(path, 'w').write(str(n))\n"
        "print('attempt', n, flush=True)\n"
        "sys.exit(0 if n >= 3 else 1)\n"
    )
    result = raypod_cli(
        raypod_server,
        "job",
        "submit",
        "-c",
        "shared",
        "--working-dir",
        ".",
        "--max-retries",
        "3",
        "--backoff",
        "0.5",
        "-o",
        "json",
        "--",
        "python",
        "flaky.py",
        cwd=tmp_path / "work",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    job = json.loads(result.stdout[result.stdout.index("{") :])
    assert job["status"] == "SUCCEEDED"
    assert [a["status"] for a in job["attempts"]] == ["FAILED", "FAILED", "SUCCEEDED"]
    listed = raypod_cli(raypod_server, "job", "list", "-c", "shared", "-o", "json")
    assert job["id"] in [j["id"] for j in json.loads(listed.stdout)]
    first = raypod_cli(raypod_server, "job", "logs", job["id"], "--attempt", "1")
    assert "attempt 1" in first.stdout


def test_a_stopped_job_is_not_retried(raypod_server: RaypodServer, shared_cluster: state.ClusterView) -> None:
    """A 0.2 s backoff, so the 3 s window below holds 15 backoffs and 3 supervisor passes: a stopped job that were
    retried would show a second attempt in it."""
    submitted = raypod_cli(
        raypod_server, "job", "submit", "-c", "shared", "--max-retries", "3", "--backoff", "0.2", "--no-wait",
        "-o", "json", "--", "sleep", "60",
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr[-2000:]
    job_id = json.loads(submitted.stdout)["id"]
    with raypod_server.client() as api:
        deadline = time.monotonic() + 60
        while api.request("GET", f"/api/v1/jobs/{job_id}")["status"] != "RUNNING":
            assert time.monotonic() < deadline
            time.sleep(0.3)
        assert raypod_cli(raypod_server, "job", "stop", job_id).returncode == 0
        while (job := api.request("GET", f"/api/v1/jobs/{job_id}"))["status"] not in ("STOPPED", "FAILED"):
            assert time.monotonic() < deadline
            time.sleep(0.3)
        time.sleep(3)  # the claim is that nothing happens: a window, not a condition, is what can show it
        job = api.request("GET", f"/api/v1/jobs/{job_id}")
    assert job["status"] == "STOPPED" and len(job["attempts"]) == 1


def test_ray_job_status_stop_and_logs_follow_through_raypod_addresses(
    raypod_server: RaypodServer, shared_cluster: state.ClusterView
) -> None:
    def submission_id(result: subprocess.CompletedProcess[str]) -> str:
        found = re.search(r"Job '(raysubmit_\w+)' submitted successfully", result.stdout + result.stderr)
        assert found, (result.stdout + result.stderr)[-2000:]
        return found.group(1)

    sleeper = submission_id(
        ray_cli(raypod_server, "job", "submit", "--address", "raypod://shared", "--no-wait", "--", "sleep", "120")
    )
    status = ray_cli(raypod_server, "job", "status", "--address", "raypod://shared", sleeper)
    assert status.returncode == 0 and re.search(r"PENDING|RUNNING", status.stdout + status.stderr)
    stopped = ray_cli(raypod_server, "job", "stop", "--address", "raypod://shared", sleeper)
    assert stopped.returncode == 0, stopped.stderr[-2000:]
    final = ray_cli(raypod_server, "job", "status", "--address", "raypod://shared", sleeper)
    assert re.search(r"STOPPED|was stopped", final.stdout + final.stderr), final.stdout[-1000:]

    counter = submission_id(
        ray_cli(
            raypod_server,
            "job",
            "submit",
            "--address",
            "raypod://shared/default",
            "--no-wait",
            "--",
            "bash",
            "-c",
            "for i in 0 1 2 3; do echo count $i; sleep 1; done",  # ray job submit shell-quotes each argument
        )
    )
    followed = ray_cli(raypod_server, "job", "logs", "--address", "raypod://shared", "--follow", counter)
    assert followed.returncode == 0, followed.stderr[-2000:]
    assert "count 3" in followed.stdout + followed.stderr
