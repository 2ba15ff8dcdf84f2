from __future__ import annotations

import io
import zipfile
from datetime import UTC, datetime, timedelta

import pytest

from raypod import errors
from raypod.controlplane import jobs

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def job(attempts: int, max_retries: int = 2, stop_requested: bool = False) -> jobs.JobView:
    return jobs.JobView(
        id="rj-0123456789",
        namespace="default",
        cluster="demo",
        owner="alice",
        spec=jobs.JobSpec(entrypoint="python x.py", max_retries=max_retries, backoff_s=2.0),
        status=jobs.JobStatus.RUNNING,
        stop_requested=stop_requested,
        created_at=NOW,
        attempts=[jobs.Attempt(submission_id=f"rj-0123456789-{i + 1}", submitted_at=NOW) for i in range(attempts)],
    )


def test_running_attempts_are_left_alone() -> None:
    assert jobs.decide(job(1), "RUNNING", NOW) == (jobs.Decision.WAIT, None)
    assert jobs.decide(job(1), "PENDING", NOW) == (jobs.Decision.WAIT, None)


def test_failed_attempts_are_retried_with_exponential_backoff_until_the_limit() -> None:
    assert jobs.decide(job(1), "FAILED", NOW) == (jobs.Decision.RETRY, NOW + timedelta(seconds=2))
    assert jobs.decide(job(2), "FAILED", NOW) == (jobs.Decision.RETRY, NOW + timedelta(seconds=4))
    assert jobs.decide(job(3), "FAILED", NOW) == (jobs.Decision.FAIL, None)
    assert jobs.decide(job(1, max_retries=0), "FAILED", NOW) == (jobs.Decision.FAIL, None)


def test_stopped_jobs_are_never_retried() -> None:
    assert jobs.decide(job(1), "STOPPED", NOW) == (jobs.Decision.STOP, None)
    assert jobs.decide(job(1, stop_requested=True), "FAILED", NOW) == (jobs.Decision.STOP, None)


def test_success_ends_the_job() -> None:
    assert jobs.decide(job(2), "SUCCEEDED", NOW) == (jobs.Decision.SUCCEED, None)


def test_a_picked_folder_becomes_a_deterministic_zip_of_its_contents() -> None:
    files = [("project/b/data.txt", b"bee"), ("project/a.py", b"print('a')")]
    package = jobs.build_package(files)
    assert package == jobs.build_package(list(reversed(files)))
    with zipfile.ZipFile(io.BytesIO(package)) as archive:
        assert archive.namelist() == ["a.py", "b/data.txt"]
        assert archive.read("b/data.txt") == b"bee"


def test_files_without_a_shared_folder_keep_their_paths() -> None:
    package = jobs.build_package([("a.py", b"1"), ("lib/b.py", b"2")])
    with zipfile.ZipFile(io.BytesIO(package)) as archive:
        assert archive.namelist() == ["a.py", "lib/b.py"]


@pytest.mark.parametrize(
    "name", ["/etc/passwd", "../up.py", "dir/../../up.py", "a/../b.py", "", "..", "C:\\\\x\\\\..\\\\..\\\\y"]
)
def test_unsafe_upload_paths_are_refused(name: str) -> None:
    with pytest.raises(errors.InvalidSpec, match="unsafe file path"):
        jobs.build_package([(name, b"x"), ("ok.py", b"y")])


def test_empty_and_oversized_uploads_are_refused() -> None:
    with pytest.raises(errors.InvalidSpec, match="no files"):
        jobs.build_package([])
    with pytest.raises(errors.InvalidSpec, match="MiB"):
        jobs.build_package([("big.bin", b"\0" * (jobs.MAX_WORKING_DIR_BYTES + 1))])
