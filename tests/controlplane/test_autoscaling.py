"""The autoscaler as a step of the reconcile loop, over a real store, real governance and the in-memory backend
(the resource state is what a GCS would report; a real one is in tests/e2e/test_autoscaling.py): a scale-up is a
request like a user's, queued with its reason over quota; an infeasible demand is reported once; an autoscaler that
fails is reported once, tried again each pass, and the cluster keeps its size."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raypod import config, errors, state
from raypod import spec as spec_mod
from raypod.backends import base, fake
from raypod.controlplane import identity
from raypod.controlplane.plane import ControlPlane
from tests.capabilities.autoscaling.test_scaler import resource_state

ADMIN = identity.Principal("root", is_admin=True)
SPEC = {
    "name": "grow",
    "namespace": "ml",
    "head": {"cpus": 0},
    "worker_groups": [{"name": "cpu", "replicas": 1, "min_replicas": 1, "max_replicas": 4}],
    "autoscaling": {"idle_timeout_s": 10},
}


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[ControlPlane]:
    features = fake.FakeBackend().features | {base.Feature.AUTOSCALING, base.Feature.RESOURCE_STATE}
    opened = ControlPlane.open(config.Settings(home=tmp_path, tls=False), backend=fake.FakeBackend(features=features))
    opened.identities.create_team("ml")
    opened.identities.create_namespace("ml", "ml")
    try:
        yield opened  # its loops are not started: the tests run the reconciler's passes themselves
    finally:
        opened.backend.close()
        opened.store.close()


def settle(plane: ControlPlane, passes: int = 4) -> state.ClusterView:
    for _ in range(passes):
        plane.reconciler.reconcile_all()
    return plane.store.get("ml", "grow")


def demand(plane: ControlPlane, view: state.ClusterView, **kwargs: Any) -> None:
    """What the cluster's GCS reports: its (fake) nodes and ``kwargs``' demand."""
    fake_backend = plane.backend
    assert isinstance(fake_backend, fake.FakeBackend)
    fake_backend.resource_states[view.uid] = resource_state(**kwargs)


def reasons(plane: ControlPlane) -> list[str]:
    return [e.reason for e in plane.store.events("ml", "grow")]


def test_a_scale_up_over_quota_waits_with_its_reason_and_goes_on_when_quota_frees(plane: ControlPlane) -> None:
    plane.governance.set_quota(ADMIN, "ml", spec_mod.QuotaSpec(cpus=2))
    view = plane.clusters.create(ADMIN, spec_mod.parse_spec(SPEC))
    view = settle(plane)
    demand(plane, view, busy={"cpu-0": False}, gang=4)
    view = settle(plane)
    assert view.spec.group("cpu").replicas == 1 and view.pending_spec is not None
    assert view.pending_spec.group("cpu").replicas == 4
    assert view.status.autoscaling is not None
    [waiting] = view.status.autoscaling.pending
    assert waiting.placement_group and waiting.count == 4
    assert waiting.reason.startswith("over quota: team ml is at its quota"), waiting.reason
    assert reasons(plane).count("ScaleQueued") == 1, "asked again each pass"

    plane.governance.set_quota(ADMIN, "ml", spec_mod.QuotaSpec(cpus=4))
    view = settle(plane)
    assert view.spec.group("cpu").replicas == 4 and view.pending_spec is None
    assert "ScaleAdmitted" in reasons(plane)
    assert {n.name for n in view.status.nodes} == {"head", "cpu-0", "cpu-1", "cpu-2", "cpu-3"}


def test_a_scale_up_within_quota_is_recorded_with_the_demand_behind_it(plane: ControlPlane) -> None:
    view = plane.clusters.create(ADMIN, spec_mod.parse_spec(SPEC))
    view = settle(plane)
    demand(plane, view, busy={"cpu-0": True}, tasks=({"CPU": 1}, 2))
    view = settle(plane)
    assert view.spec.group("cpu").replicas == 3
    [scaled] = [e for e in plane.store.events("ml", "grow") if e.reason == "ScaledUp"]
    assert scaled.message == "worker group cpu: 1 -> 3 replicas (pending demand: 2 x {1 CPU})"


def test_an_infeasible_demand_is_reported_once_and_not_scaled_for(plane: ControlPlane) -> None:
    view = plane.clusters.create(ADMIN, spec_mod.parse_spec(SPEC))
    view = settle(plane)
    demand(plane, view, busy={"cpu-0": False}, tasks=({"CPU": 64}, 1))
    view = settle(plane, passes=6)
    assert view.spec.group("cpu").replicas == 1
    assert reasons(plane).count("InfeasibleDemand") == 1
    assert view.status.autoscaling is not None
    assert [d.reason for d in view.status.autoscaling.pending] == ["no node shape fits"]


def test_an_autoscaler_that_fails_is_reported_once_retried_and_the_cluster_keeps_its_size(plane: ControlPlane) -> None:
    view = plane.clusters.create(ADMIN, spec_mod.parse_spec(SPEC))
    view = settle(plane)
    fake_backend = plane.backend
    assert isinstance(fake_backend, fake.FakeBackend)
    fake_backend.resource_state_error = errors.TransientError("the GCS did not answer")
    view = settle(plane, passes=5)
    assert reasons(plane).count("AutoscalerFailed") == 1
    assert view.spec.group("cpu").replicas == 1 and view.status.phase is state.ClusterPhase.READY
    assert view.status.autoscaling is not None and "the GCS did not answer" in view.status.autoscaling.message

    fake_backend.resource_state_error = None
    demand(plane, view, busy={"cpu-0": True}, tasks=({"CPU": 1}, 1))
    view = settle(plane)
    assert "AutoscalerRecovered" in reasons(plane)
    assert view.spec.group("cpu").replicas == 2 and view.status.autoscaling is not None
    assert not view.status.autoscaling.message
