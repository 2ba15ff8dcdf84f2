"""What a newcomer does first works: on a cluster made with the README's own command, unchanged Ray Train, Data,
Tune and Serve scripts submitted with plain ``ray job submit --address raypod://...`` succeed, and raypod lists
them (CLI, SDK and console) as submitted with Ray tooling."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from raypod import state
from raypod.client._http import tls_verify
from tests.e2e.conftest import RaypodServer, wait_until
from tests.e2e.test_gateway import run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

SCRIPTS = Path(__file__).parent / "scripts"


@pytest.fixture(scope="module")
def libs_cluster(raypod_server: RaypodServer) -> Iterator[str]:
    created = run_cli(raypod_server, "raypod", "cluster", "create", "libs", "--workers", "2", "--worker-cpus", "1")
    assert created.returncode == 0, created.stderr
    yield "libs"
    run_cli(raypod_server, "raypod", "cluster", "delete", "libs")


@pytest.mark.parametrize(
    ("script", "last_line"),
    [
        ("train_script.py", "train-finished True"),
        ("data_script.py", "data-finished 999000"),
        ("tune_script.py", "tune-finished 3"),
        ("serve_script.py", "serve-finished 42"),
    ],
)
def test_unchanged_ray_library_scripts_run_through_the_gateway(
    raypod_server: RaypodServer, libs_cluster: str, tmp_path: Path, script: str, last_line: str
) -> None:
    shutil.copy(SCRIPTS / script, tmp_path / script)
    result = run_cli(
        raypod_server,
        "ray",
        "job",
        "submit",
        "--address",
        f"raypod://{libs_cluster}",
        "--working-dir",
        str(tmp_path),
        "--",
        "python",
        script,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert last_line in result.stdout


def test_jobs_of_plain_ray_tooling_appear_in_raypod(
    raypod_server: RaypodServer, libs_cluster: str, tmp_path: Path
) -> None:
    """A job of its own, submitted with ``ray job submit``, is listed by the SDK, the CLI and the console as
    submitted with Ray tooling, under the submission id Ray gave it."""
    (tmp_path / "hello.py").write_text("print('hello-from-ray-tooling')\n")
    address = f"raypod://{libs_cluster}"
    result = run_cli(raypod_server, "ray", "job", "submit", "--address", address, "--working-dir", str(tmp_path),
                     "--", "python", "hello.py")  # fmt: skip
    assert result.returncode == 0 and "hello-from-ray-tooling" in result.stdout, result.stdout[-2000:]
    found = re.search(r"raysubmit_\w+", result.stdout + result.stderr)
    assert found, result.stdout[-2000:]
    submission = found.group(0)
    with raypod_server.client() as api:

        def imported() -> state.JobView | None:
            jobs = api.jobs.list(libs_cluster)
            return next((j for j in jobs if any(a.submission_id == submission for a in j.attempts)), None)

        job = wait_until(imported, "raypod to import the job Ray ran", 60)
        # The gateway wrote who submitted it into the job's metadata.
        assert job.submitted_via is state.SubmittedVia.RAY and job.owner == "admin"
        assert api.jobs.wait(job.id, timeout=60).status is state.JobStatus.SUCCEEDED
        assert "hello-from-ray-tooling" in api.jobs.logs(job.id)
    listed = run_cli(raypod_server, "raypod", "job", "list", "-c", libs_cluster)
    line = next((li for li in listed.stdout.splitlines() if submission in li), "")
    assert "via=ray " in line and "by=admin " in line, listed.stdout
    with httpx.Client(base_url=raypod_server.url, verify=tls_verify(raypod_server.ca_file)) as browser:
        browser.post("/login", data={"token": raypod_server.admin_token}).raise_for_status()
        page = browser.get(f"/namespaces/default/clusters/{libs_cluster}")
        assert page.status_code == 200
        row = next((r for r in page.text.split("<tr") if job.id in r), "")
        assert 'data-testid="job-via">Ray tooling' in row, row[:500]
