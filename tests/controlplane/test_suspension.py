"""Idle suspension as a step of the reconcile loop, over a real store, real governance and the in-memory backend
(Ray's resource state as a GCS reports it; real Ray in tests/e2e/test_autoscaling.py): an idle cluster is
suspended and gives its quota back, one with a running job is not, and a job submitted to a suspended cluster
resumes it and runs."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from raypod import config, state
from raypod import spec as spec_mod
from raypod.backends import base, fake
from raypod.controlplane import identity, suspension
from raypod.controlplane.plane import ControlPlane
from tests.capabilities.autoscaling.test_scaler import resource_state

ADMIN = identity.Principal("root", is_admin=True)
SPEC = {"name": "idle", "namespace": "ml", "worker_groups": [{"name": "cpu", "replicas": 1}], "suspend_after_idle_s": 1}


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[ControlPlane]:
    backend = fake.FakeBackend(features=fake.FakeBackend().features | {base.Feature.RESOURCE_STATE})
    opened = ControlPlane.open(config.Settings(home=tmp_path, tls=False), backend=backend)
    opened.identities.create_team("ml")
    opened.identities.create_namespace("ml", "ml")
    try:
        yield opened  # its loops are not started: the tests run the passes themselves
    finally:
        opened.backend.close()
        opened.store.close()


def passes_until(plane: ControlPlane, name: str, done: object, timeout: float = 10.0) -> state.ClusterView:
    deadline = time.monotonic() + timeout
    while True:
        plane.reconciler.reconcile_all()
        plane.supervisor.run_once()
        view = plane.store.get("ml", name)
        if done(view):  # type: ignore[operator]
            return view
        assert time.monotonic() < deadline, f"timed out; last: {view.status.phase} {view.status.message}"
        time.sleep(0.05)


def idle_ray(plane: ControlPlane, view: state.ClusterView, idle_s: float = 60.0) -> None:
    backend = plane.backend
    assert isinstance(backend, fake.FakeBackend)
    backend.resource_states[view.uid] = resource_state(busy={"cpu-0": False}, idle_s={"head": idle_s, "cpu-0": idle_s})


def test_an_idle_cluster_is_suspended_gives_its_quota_back_and_a_job_resumes_it(plane: ControlPlane) -> None:
    plane.governance.set_quota(ADMIN, "ml", spec_mod.QuotaSpec(cpus=2))
    view = plane.clusters.create(ADMIN, spec_mod.parse_spec(SPEC))
    view = passes_until(plane, "idle", lambda v: v.status.phase is state.ClusterPhase.READY)
    idle_ray(plane, view)  # every node idle, nothing waiting
    view = passes_until(plane, "idle", lambda v: v.status.phase is state.ClusterPhase.SUSPENDED and not v.status.nodes)
    assert view.suspended
    assert "Suspended" in [e.reason for e in plane.store.events("ml", "idle")]
    # its quota is free: a second cluster of the whole quota is admitted
    other = plane.clusters.create(ADMIN, spec_mod.parse_spec({**SPEC, "name": "other", "suspend_after_idle_s": None}))
    assert not other.queued

    plane.clusters.delete(ADMIN, "ml", "other")
    passes_until(plane, "idle", lambda v: not any(c.spec.name == "other" for c in plane.store.list()))
    job = plane.jobs.submit(ADMIN, "ml", "idle", spec_mod.JobSpec(entrypoint="python x.py"))
    view = passes_until(plane, "idle", lambda v: v.status.phase is state.ClusterPhase.READY)
    assert not view.suspended and "Resumed" in [e.reason for e in plane.store.events("ml", "idle")]
    found = passes_until(plane, "idle", lambda v: plane.jobs.records.load(job.id).attempts)
    assert found.status.phase is state.ClusterPhase.READY


def test_a_cluster_with_a_running_job_busy_ray_or_a_users_actor_is_not_suspended(plane: ControlPlane) -> None:
    view = plane.clusters.create(ADMIN, spec_mod.parse_spec(SPEC))
    view = passes_until(plane, "idle", lambda v: v.status.phase is state.ClusterPhase.READY)
    plane.jobs.submit(ADMIN, "ml", "idle", spec_mod.JobSpec(entrypoint="python x.py"))
    idle_ray(plane, view)
    deadline = time.monotonic() + 1.6  # well over the timeout
    while time.monotonic() < deadline:
        plane.reconciler.reconcile_all()
        plane.supervisor.run_once()
        time.sleep(0.05)
    assert not plane.store.get("ml", "idle").suspended, "suspended under a running job"

    backend = plane.backend
    assert isinstance(backend, fake.FakeBackend)
    for jobs in backend.ray_jobs.values():  # the job ends; now Ray is busy instead
        for job in jobs.values():
            job["status"] = "SUCCEEDED"
    backend.resource_states[view.uid] = resource_state(busy={"cpu-0": True})
    deadline = time.monotonic() + 1.6
    while time.monotonic() < deadline:
        plane.reconciler.reconcile_all()
        plane.supervisor.run_once()
        time.sleep(0.05)
    assert not plane.store.get("ml", "idle").suspended, "suspended while Ray had work"

    # Nothing holds resources, but a user's (0-CPU) actor lives; the libraries' own do not count.
    idle_ray(plane, view)
    backend.actors[view.uid] = [{"class_name": "_AutoscalingCoordinatorActor"}, {"class_name": "Counter"}]
    deadline = time.monotonic() + 1.6
    while time.monotonic() < deadline:
        plane.reconciler.reconcile_all()
        time.sleep(0.05)
    assert not plane.store.get("ml", "idle").suspended, "suspended under a user's actor"
    backend.actors[view.uid] = [{"class_name": "_AutoscalingCoordinatorActor"}, {"class_name": "TrainStateActor"}]
    passes_until(plane, "idle", lambda v: v.suspended)


def test_without_the_gcs_feed_as_on_kuberay_rays_state_api_says_whether_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(suspension, "STATE_API_EVERY_S", 0.0)
    backend = fake.FakeBackend()  # no RESOURCE_STATE: raypod does not read this cluster's GCS (KubeRay's case)
    plane = ControlPlane.open(config.Settings(home=tmp_path, tls=False), backend=backend)
    try:
        plane.identities.create_team("ml")
        plane.identities.create_namespace("ml", "ml")
        view = plane.clusters.create(ADMIN, spec_mod.parse_spec(SPEC))
        view = passes_until(plane, "idle", lambda v: v.status.phase is state.ClusterPhase.READY)
        backend.live_tasks[view.uid] = [{"name": "train_step", "state": "RUNNING"}]
        deadline = time.monotonic() + 1.6  # well over the timeout
        while time.monotonic() < deadline:
            plane.reconciler.reconcile_all()
            time.sleep(0.05)
        assert not plane.store.get("ml", "idle").suspended, "suspended while a task ran"
        backend.live_tasks[view.uid] = []
        passes_until(plane, "idle", lambda v: v.suspended)
    finally:
        plane.backend.close()
        plane.store.close()


def test_a_workspace_keeps_its_cluster_up_while_in_use_and_not_after(
    plane: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the IDE answers is tests/capabilities/spaces/test_activity.py's (a real JupyterLab); here, the rule."""
    answers: list[Callable[[], float | None]] = [lambda: None]
    monkeypatch.setattr(suspension.activity, "last_activity", lambda *_args: answers[-1]())
    view = plane.clusters.create(ADMIN, spec_mod.parse_spec({**SPEC, "spaces": [{"name": "nb"}]}))
    view = passes_until(plane, "idle", lambda v: v.status.phase is state.ClusterPhase.READY)
    backend = plane.backend
    assert isinstance(backend, fake.FakeBackend)
    backend.sidecar_endpoints[view.uid] = {"space/nb": "http://ide.fake"}
    idle_ray(plane, view)
    for what, used in (("a kernel runs code", lambda: None), ("it was just used", time.time)):
        answers.append(used)
        deadline = time.monotonic() + 1.6  # well over the timeout
        while time.monotonic() < deadline:
            plane.reconciler.reconcile_all()
            time.sleep(0.05)
        assert not plane.store.get("ml", "idle").suspended, f"suspended while {what}"
    answers.append(lambda: time.time() - 60)  # last used a minute ago
    passes_until(plane, "idle", lambda v: v.suspended)
