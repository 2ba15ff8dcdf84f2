from __future__ import annotations

import io
import zipfile
from datetime import UTC, datetime, timedelta

import pytest

from raypod import errors, state
from raypod import spec as spec_mod
from raypod.controlplane.jobs import packaging, retry

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def job(attempts: int, max_retries: int = 2, stop_requested: bool = False) -> state.JobView:
    return state.JobView(
        id="rj-0123456789",
        namespace="default",
        cluster="demo",
        owner="alice",
        spec=spec_mod.JobSpec(entrypoint="python x.py", max_retries=max_retries, backoff_s=2.0),
        status=state.JobStatus.RUNNING,
        stop_requested=stop_requested,
        created_at=NOW,
        attempts=[state.Attempt(submission_id=f"rj-0123456789-{i + 1}", submitted_at=NOW) for i in range(attempts)],
    )


def test_running_attempts_are_left_alone() -> None:
    assert retry.decide(job(1), "RUNNING", NOW) == (retry.Decision.WAIT, None)
    assert retry.decide(job(1), "PENDING", NOW) == (retry.Decision.WAIT, None)


def test_failed_attempts_are_retried_with_exponential_backoff_until_the_limit() -> None:
    assert retry.decide(job(1), "FAILED", NOW) == (retry.Decision.RETRY, NOW + timedelta(seconds=2))
    assert retry.decide(job(2), "FAILED", NOW) == (retry.Decision.RETRY, NOW + timedelta(seconds=4))
    assert retry.decide(job(3), "FAILED", NOW) == (retry.Decision.FAIL, None)
    assert retry.decide(job(1, max_retries=0), "FAILED", NOW) == (retry.Decision.FAIL, None)


def test_stopped_jobs_are_never_retried() -> None:
    assert retry.decide(job(1), "STOPPED", NOW) == (retry.Decision.STOP, None)
    assert retry.decide(job(1, stop_requested=True), "FAILED", NOW) == (retry.Decision.STOP, None)


def test_success_ends_the_job() -> None:
    assert retry.decide(job(2), "SUCCEEDED", NOW) == (retry.Decision.SUCCEED, None)


def test_a_picked_folder_becomes_a_deterministic_zip_of_its_contents() -> None:
    files = [("project/b/data.txt", b"bee"), ("project/a.py", b"print('a')")]
    package = packaging.build_package(files)
    assert package == packaging.build_package(list(reversed(files)))
    with zipfile.ZipFile(io.BytesIO(package)) as archive:
        assert archive.namelist() == ["a.py", "b/data.txt"]
        assert archive.read("b/data.txt") == b"bee"


def test_files_without_a_shared_folder_keep_their_paths() -> None:
    package = packaging.build_package([("a.py", b"1"), ("lib/b.py", b"2")])
    with zipfile.ZipFile(io.BytesIO(package)) as archive:
        assert archive.namelist() == ["a.py", "lib/b.py"]


@pytest.mark.parametrize(
    "name", ["/etc/passwd", "../up.py", "dir/../../up.py", "a/../b.py", "", "..", "C:\\\\x\\\\..\\\\..\\\\y"]
)
def test_unsafe_upload_paths_are_refused(name: str) -> None:
    with pytest.raises(errors.InvalidSpec, match="unsafe file path"):
        packaging.build_package([(name, b"x"), ("ok.py", b"y")])


def test_empty_and_oversized_uploads_are_refused() -> None:
    with pytest.raises(errors.InvalidSpec, match="no files"):
        packaging.build_package([])
    with pytest.raises(errors.InvalidSpec, match="MiB"):
        packaging.build_package([("big.bin", b"\0" * (packaging.MAX_WORKING_DIR_BYTES + 1))])


def test_a_copy_read_before_the_job_ended_cannot_undo_its_end(tmp_path: object) -> None:
    """The supervisor saves what it read before the hang collector failed the job: the failure stands."""
    from pathlib import Path

    from raypod.controlplane import store
    from raypod.controlplane.store.jobs import JobRecords

    db = store.Store(f"sqlite:///{Path(str(tmp_path)) / 'raypod.db'}")
    records = JobRecords(db.engine)
    running = job(1)
    assert records.insert(running)
    stale = records.load(running.id)
    records.save(stale.model_copy(update={"status": state.JobStatus.FAILED}))
    records.save(stale.model_copy(update={"status": state.JobStatus.RUNNING}))
    assert records.load(running.id).status is state.JobStatus.FAILED
