"""Scheduled jobs over a real store and the in-memory backend, the runner driven with a clock of the test's: a due
run is a job, times missed while the server was down run once, concurrency policies, suspension, a bad cron is a
clear error, and a server killed between making a run and noting it makes no second run after its restart (the
crash is played by a runner that never noted the time, then a new runner over the same database)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pydantic
import pytest

from raypod import config, state
from raypod import spec as spec_mod
from raypod.backends import fake
from raypod.controlplane import identity
from raypod.controlplane.plane import ControlPlane
from raypod.controlplane.schedules import ScheduleRunner, ScheduleService

ADMIN = identity.Principal("root", is_admin=True)
T0 = datetime(2026, 12, 7, 2, 0, tzinfo=UTC)


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[ControlPlane]:
    opened = ControlPlane.open(config.Settings(home=tmp_path, tls=False), backend=fake.FakeBackend())
    try:
        opened.clusters.create(ADMIN, spec_mod.parse_spec({"name": "demo", "worker_groups": []}))
        for _ in range(4):
            opened.reconciler.reconcile_all()
        yield opened  # its loops are not started: the tests run the passes themselves
    finally:
        opened.backend.close()
        opened.store.close()


def nightly(plane: ControlPlane, **changes: object) -> state.ScheduleView:
    spec = spec_mod.ScheduleSpec(
        name="nightly", cluster="demo", cron="0 3 * * *", job=spec_mod.JobSpec(entrypoint="python x.py"), **changes
    )
    plane.schedules.records.insert(spec, "admin")
    with plane.store.engine.begin() as connection:  # as if created at T0
        from raypod.controlplane.store import schema

        connection.execute(schema.schedules.update().values(created_at=T0))
    return plane.schedules.records.get("default", "nightly")


def runs(plane: ControlPlane) -> list[state.JobView]:
    return [j for j in plane.jobs.records.of_cluster("default", "demo") if "raypod.schedule" in j.spec.metadata]


def test_a_due_run_is_a_job_and_times_missed_while_down_run_once(plane: ControlPlane) -> None:
    nightly(plane)
    runner = ScheduleRunner(plane.schedules)
    runner.run_once(now=T0 + timedelta(minutes=30))
    assert runs(plane) == []
    runner.run_once(now=T0 + timedelta(hours=1, seconds=5))  # 03:00:05
    [first] = runs(plane)
    assert first.spec.metadata["raypod.scheduled_for"] == "2026-12-07T03:00:00+00:00" and first.owner == "admin"
    runner.run_once(now=T0 + timedelta(hours=1, seconds=50))
    assert len(runs(plane)) == 1, "a time ran twice"
    runner.run_once(now=T0 + timedelta(days=4, hours=2))  # down for three days: one run, for the latest time
    assert [j.spec.metadata["raypod.scheduled_for"] for j in runs(plane)] == [
        "2026-12-07T03:00:00+00:00",
        "2026-12-11T03:00:00+00:00",
    ]
    view = plane.schedules.get(ADMIN, "default", "nightly")
    assert view.next_run_at == datetime(2026, 12, 12, 3, 0, tzinfo=UTC) and view.last_message.startswith("run rj-")


def test_a_server_killed_between_making_a_run_and_noting_it_makes_no_second_run(plane: ControlPlane) -> None:
    nightly(plane)
    due = T0 + timedelta(hours=1, seconds=1)

    class Killed(ScheduleRunner):
        def run_once(self, now: datetime | None = None) -> None:
            view = self.schedules.records.get("default", "nightly")
            self._make_run(view, T0 + timedelta(hours=1))  # the run is made ... and the process dies here

    Killed(plane.schedules).run_once(now=due)
    assert len(runs(plane)) == 1
    restarted = ScheduleRunner(ScheduleService(plane.jobs))  # a new process over the same database
    restarted.run_once(now=due)
    assert len(runs(plane)) == 1, "the time ran twice after the restart"
    assert plane.schedules.records.get("default", "nightly").last_message.startswith("already run as rj-")


@pytest.mark.parametrize("policy", list(spec_mod.ConcurrencyPolicy))
def test_concurrency_policies(plane: ControlPlane, policy: spec_mod.ConcurrencyPolicy) -> None:
    nightly(plane, concurrency_policy=policy)
    runner = ScheduleRunner(plane.schedules)
    runner.run_once(now=T0 + timedelta(hours=1))
    plane.supervisor.run_once()  # submitted: it runs on the (fake) Ray
    runner.run_once(now=T0 + timedelta(days=1, hours=1))
    found = runs(plane)
    if policy is spec_mod.ConcurrencyPolicy.FORBID:
        assert len(found) == 1
        assert "skipped" in plane.schedules.records.get("default", "nightly").last_message
    else:
        assert len(found) == 2
        assert found[0].stop_requested is (policy is spec_mod.ConcurrencyPolicy.REPLACE)


def test_a_suspended_schedule_makes_no_run_and_is_not_owed_the_times_it_missed(plane: ControlPlane) -> None:
    nightly(plane)
    plane.schedules.set_suspended(ADMIN, "default", "nightly", True)
    runner = ScheduleRunner(plane.schedules)
    runner.run_once(now=T0 + timedelta(hours=2))
    assert runs(plane) == [] and plane.schedules.get(ADMIN, "default", "nightly").next_run_at is None
    plane.schedules.set_suspended(ADMIN, "default", "nightly", False)
    runner.run_once(now=store_now(plane))
    assert runs(plane) == []


def store_now(plane: ControlPlane) -> datetime:
    from raypod.controlplane import store

    return store.now()


@pytest.mark.parametrize("cron", ["0 3 * *", "61 * * * *", "every night", "0 3 * * * *"])
def test_a_bad_cron_is_a_clear_error(cron: str) -> None:
    with pytest.raises(pydantic.ValidationError, match="is not a cron expression"):
        spec_mod.ScheduleSpec(name="x", cluster="demo", cron=cron, job=spec_mod.JobSpec(entrypoint="true"))
