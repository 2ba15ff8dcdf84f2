"""Idle suspension, a step of the reconcile loop: a cluster with ``suspend_after_idle_s`` that has had nothing
running for that long is suspended (every node stops; its spec, its workspaces' files and its history stay; its
quota is given back at once); ``resume`` (``raypod cluster resume``, or a job submitted to it) brings it back.

Nothing runs means all of, for the whole time: the cluster is Ready; no raypod job of it is pending or running
(plain-Ray submissions are imported as jobs too); no model deployment is on it; no workspace of it runs; its Ray
has no pending demand and no task, actor or placement group holds any of its resources (on KubeRay, whose GCS raypod
does not read: no task is unfinished and no placement group is kept, as Ray's state API says, asked at most every
10 s); and no actor is alive but
the libraries' own (classes whose names start with ``_``, such as Ray Data's ``_AutoscalingCoordinatorActor``, and
Ray Train's ``TrainStateActor``): a Serve controller or a user's detached actor keeps it up. What raypod cannot see
(the GCS or the dashboard does not answer, a backend that does not report Ray's resource state) is never taken for
idle. The time counts on the server's clock from the first pass that found it so; a restarted server counts anew.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from raypod import state
from raypod.backends import base, ray_jobs
from raypod.capabilities.autoscaling import scaler
from raypod.controlplane.clusters import ClusterService
from raypod.controlplane.store.jobs import JobRecords
from raypod.controlplane.store.models import DeploymentStore

HEAD = "head"
STATE_API_EVERY_S = 10.0
SYSTEM_ACTORS = frozenset({"TrainStateActor"})  # besides every class named _...: libraries' own, kept after runs


class IdleSuspender:
    def __init__(self, clusters: ClusterService, api: Callable[[state.ClusterView], ray_jobs.RayJobApi]) -> None:
        self.clusters = clusters
        self.api = api  # the cluster's Ray dashboard (its state API), as raypod reaches it
        self.jobs = JobRecords(clusters.store.engine)
        self.deployments = DeploymentStore(clusters.store.engine)
        self._quiet_since: dict[str, float] = {}  # raypod's side (jobs, deployments, workspaces), this process' clock
        self._state_api_answers: dict[str, tuple[float, bool]] = {}  # cluster uid -> (when, quiet), without the GCS

    def step(self, view: state.ClusterView, observed: state.ObservedCluster) -> None:
        """Suspend ``view`` if it has been idle for its ``suspend_after_idle_s``."""
        timeout = view.spec.suspend_after_idle_s
        if timeout is None or view.deleting or view.queued or view.suspended:
            self._quiet_since.pop(view.uid, None)
            return
        if view.status.phase is not state.ClusterPhase.READY:  # starting, changing, or not observable
            self._quiet_since.pop(view.uid, None)
            return
        if not self._quiet_in_raypod(view) or not self._quiet_in_ray(view, observed):
            self._quiet_since.pop(view.uid, None)
            return
        since = self._quiet_since.setdefault(view.uid, time.monotonic())
        if time.monotonic() - since < timeout or self._user_actors(view):
            return
        self._quiet_since.pop(view.uid, None)
        self.clusters.suspend(view, f"nothing ran for {timeout} s (no job, deployment, workspace, task or actor)")

    def _quiet_in_raypod(self, view: state.ClusterView) -> bool:
        if any(space.running for space in view.spec.spaces):
            return False
        if any(job.status not in state.FINISHED_JOB_STATUSES for job in self.jobs.of_cluster(*_names(view))):
            return False
        return not self.deployments.of_cluster(view.uid)

    def _quiet_in_ray(self, view: state.ClusterView, observed: state.ObservedCluster) -> bool:
        """Nothing waits and nothing holds resources, as the cluster's GCS reports it (or, on a backend that does not
        read the GCS, KubeRay's, as Ray's state API lists tasks and placement groups); False when unknown."""
        head = observed.nodes.get(HEAD)
        if head is None or head.phase is not state.NodePhase.RUNNING:
            return False
        if base.Feature.RESOURCE_STATE not in self.clusters.backend.features:
            return self._quiet_in_state_api(view)
        if not observed.gcs_reachable:
            return False
        try:
            raw = self.clusters.backend.resource_state(view.uid)
        except Exception:  # an unreadable state is not an idle one
            return False
        return raw is not None and scaler.nothing_held(raw)

    def _quiet_in_state_api(self, view: state.ClusterView) -> bool:
        """Asked of the cluster's dashboard at most every ``STATE_API_EVERY_S`` per cluster (one call a pass per
        cluster would not scale to a thousand clusters): between two answers, the last one stands."""
        asked = self._state_api_answers.get(view.uid)
        if asked is not None and time.monotonic() - asked[0] < STATE_API_EVERY_S:
            return asked[1]
        try:
            quiet = not self.api(view).live_work()
        except Exception:  # an unreadable state is not an idle one
            quiet = False
        self._state_api_answers[view.uid] = (time.monotonic(), quiet)
        return quiet

    def _user_actors(self, view: state.ClusterView) -> list[str]:
        """The live actors that are not the libraries' own (asked only once everything else has been quiet for the
        timeout: one call to the cluster's dashboard). Unknown counts as busy."""
        try:
            actors = self.api(view).alive_actors()
        except Exception:
            return ["(the dashboard did not answer)"]
        names = [str(actor.get("class_name", "")) for actor in actors]
        return [name for name in names if not name.startswith("_") and name not in SYSTEM_ACTORS]


def _names(view: state.ClusterView) -> tuple[str, str]:
    return view.spec.namespace, view.spec.name
