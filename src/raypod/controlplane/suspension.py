"""Idle suspension, a step of the reconcile loop: a cluster with ``suspend_after_idle_s`` that has had nothing
running for that long is suspended (every node stops; its spec, its workspaces' files and its history stay; its
quota is given back at once); ``resume`` (``raypod cluster resume``, or a job submitted to it) brings it back.

Nothing runs means all of, for the whole time: the cluster is Ready; no raypod job of it is pending or running
(plain-Ray submissions are imported as jobs too); no model deployment is on it; no workspace of it is in use (a
JupyterLab whose kernels are idle and whose kernels and terminals were last active longer ago than the timeout; a
code editor, which cannot say, always counts as in use); its Ray
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

import httpx

from raypod import spec as spec_mod
from raypod import state
from raypod.backends import base, ray_jobs
from raypod.capabilities.autoscaling import scaler
from raypod.capabilities.spaces import activity
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
        used_at = self._last_used_in_raypod(view)
        if used_at is None or not self._quiet_in_ray(view, observed):
            self._quiet_since.pop(view.uid, None)
            return
        since = self._quiet_since.setdefault(view.uid, time.monotonic())
        if time.monotonic() - since < timeout or time.time() - used_at < timeout or self._user_actors(view):
            return
        self._quiet_since.pop(view.uid, None)
        self.clusters.suspend(view, f"nothing ran for {timeout} s (no job, deployment, workspace, task or actor)")

    def _last_used_in_raypod(self, view: state.ClusterView) -> float | None:
        """None while a job of it is pending or running, a deployment is on it, or a workspace of it is in use (a
        kernel runs code, or its IDE cannot tell); else when a workspace last ran code or had terminal input (0.0:
        never), so the timeout counts from then."""
        if any(job.status not in state.FINISHED_JOB_STATUSES for job in self.jobs.of_cluster(*_names(view))):
            return None
        if self.deployments.of_cluster(view.uid):
            return None
        latest = 0.0
        running = [space for space in view.spec.spaces if space.running]
        if not running:
            return latest
        with httpx.Client(timeout=5.0) as http:  # to the IDEs, through their nodes' sidecars
            for space in running:
                ide = view.status.endpoints.get(f"space/{space.name}")
                token = self.clusters.backend.sidecar_token(view.uid, space.node_name(), spec_mod.IDE_SIDECAR)
                base_path = f"/spaces/{view.spec.namespace}/{space.name}/"
                used = activity.last_activity(ide, base_path, token, space.kind, http) if ide else None
                if used is None:
                    return None
                latest = max(latest, used)
        return latest

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
