"""The control plane as one object: its store, its backend, the services the API calls and the loops that run
beside them, opened and closed together. The server only routes requests to it."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any

import raypod
from raypod import backends, config, state
from raypod.backends import base
from raypod.backends.kuberay import manifests
from raypod.capabilities.observability import charts
from raypod.controlplane import addons as node_addons
from raypod.controlplane import loop, plan
from raypod.controlplane.audit import AuditLog
from raypod.controlplane.autoscaling import Autoscaler
from raypod.controlplane.clusters import ClusterService
from raypod.controlplane.governance import GovernanceService
from raypod.controlplane.hangwatch import AgentReports, HangCollector
from raypod.controlplane.history import History
from raypod.controlplane.identity import IdentityService
from raypod.controlplane.jobs import JobService, JobSupervisor
from raypod.controlplane.jobs.attribution import Attribution
from raypod.controlplane.observability import Monitoring
from raypod.controlplane.schedules import ScheduleRunner, ScheduleService
from raypod.controlplane.serving import ModelCatalog, ServingApplier, ServingService
from raypod.controlplane.spaces import SpaceService
from raypod.controlplane.sso import SsoService
from raypod.controlplane.store import Store
from raypod.controlplane.suspension import IdleSuspender

log = logging.getLogger(__name__)


@dataclass
class ControlPlane:
    settings: config.Settings
    store: Store
    backend: base.Backend
    identities: IdentityService
    governance: GovernanceService
    reconciler: loop.Reconciler
    clusters: ClusterService
    jobs: JobService
    serving: ServingService
    spaces: SpaceService
    monitoring: Monitoring
    supervisor: JobSupervisor
    serving_applier: ServingApplier
    hangs: HangCollector
    audit: AuditLog
    schedules: ScheduleService
    schedule_runner: ScheduleRunner
    sso: SsoService | None = None  # single sign-on, when RAYPOD_SSO_ISSUER is set

    @classmethod
    def open(cls, settings: config.Settings, backend: base.Backend | None = None) -> ControlPlane:
        """Open the store (migrating it), the backend (``settings.backend`` unless one is given) and every service;
        on a first start, the admin's credentials. Nothing runs until ``start``."""
        db = Store(settings.resolved_database_url)
        chosen = backend or backends.create_backend(settings)
        if not chosen.tenancy.isolated:
            log.warning("tenancy: %s", chosen.tenancy.summary)
        ids = IdentityService(db)
        # Nodes that share no directory with the server (pods) report their agents' files over HTTP.
        reports = None if base.Feature.SHARED_ADDON_DIRS in chosen.features else AgentReports(settings.home)
        governor = GovernanceService(
            db,
            ids,
            chosen,
            priority_classes=settings.priority_classes,
            priority_teams=settings.priority_teams,
            pool=(settings.pool_cpus, settings.pool_memory, settings.pool_gpus),
            grace_s=settings.drain_timeout_s,
            admits=not settings.kueue,
        )
        reconciler = loop.Reconciler(
            db,
            chosen,
            scheduler=governor.schedule,
            interval_s=settings.reconcile_interval_s,
            settings=plan.PlanSettings(
                drain_timeout_s=settings.drain_timeout_s, node_start_timeout_s=settings.node_start_timeout_s
            ),
            gcs_unreachable_timeout_s=settings.gcs_unreachable_timeout_s,
            node_addons=node_addons.NodeAddonMaker(
                settings.home, reports, settings.node_url or settings.public_url, _ca(settings)
            ),
        )
        governor.wake = reconciler.wake
        ca_file = (settings.tls_ca or settings.tls_cert) if settings.tls else None
        if ids.bootstrap(settings.home / "credentials", settings.public_url, ca_file):
            log.info("first start: admin credentials written to %s (mode 0600)", settings.home / "credentials")
        clusters = ClusterService(db, chosen, ids, wake=reconciler.wake, governance=governor)
        reconciler.autoscale = Autoscaler(clusters).step
        job_service = JobService(clusters, settings.home / "packages")
        side_interval_s = min(settings.reconcile_interval_s, 1.0)
        supervisor = JobSupervisor(job_service, interval_s=side_interval_s)
        job_service.wake = supervisor.wake
        job_service.addons_of = reconciler.addons_of
        job_service.history = History(
            settings.history_url or str(settings.home / "history"),
            settings.history_options,
            settings.history_retention_days,
            settings.history_max_log_bytes,
        )
        job_service.metrics_series = functools.partial(charts.series, settings.home)
        job_service.attribution = Attribution(settings.home / "submitters.key")
        reconciler.before_delete = job_service.archive_cluster
        reconciler.suspend_idle = IdleSuspender(clusters, job_service.api).step
        serving = ServingService(
            clusters,
            ModelCatalog(db, settings.outbound),
            settings.model_staging_url,
            settings.model_staging_options,
        )
        schedules = ScheduleService(job_service)
        applier = ServingApplier(serving, interval_s=side_interval_s)
        serving.wake = serving.models.wake = applier.wake
        return cls(
            settings=settings,
            store=db,
            backend=chosen,
            identities=ids,
            governance=governor,
            reconciler=reconciler,
            clusters=clusters,
            jobs=job_service,
            serving=serving,
            spaces=SpaceService(clusters, settings.home),
            monitoring=Monitoring(clusters, settings.home),
            supervisor=supervisor,
            serving_applier=applier,
            hangs=HangCollector(
                db, job_service, interval_s=side_interval_s, outbound=settings.outbound, reports=reports
            ),
            audit=AuditLog(db, settings.home),
            schedules=schedules,
            schedule_runner=ScheduleRunner(schedules),
            sso=SsoService(db, ids, settings.sso, f"{settings.public_url}/login/sso/callback")
            if settings.sso
            else None,
        )

    def info(self) -> state.ServerInfo:
        """The server's version, backend and what isolates one namespace's jobs from another's."""
        return state.ServerInfo(
            version=raypod.__version__,
            backend=type(self.backend).__name__,
            tenancy=self.backend.tenancy.summary,
            isolated=self.backend.tenancy.isolated,
        )

    def manifest(self, view: state.ClusterView) -> dict[str, Any]:
        """The RayCluster that runs the cluster on Kubernetes, with what the capabilities add to its pods."""
        return manifests.raycluster(view.spec, node_addons=self.reconciler.addons_of(view.uid))

    def start(self) -> None:
        """The loops: the reconciler, the job supervisor, the serving applier and the hang collector."""
        self.supervisor.start()
        self.schedule_runner.start()
        self.serving_applier.start()
        self.hangs.start()
        self.reconciler.start()

    def close(self) -> None:
        """Stop the loops, then close the backend and the store."""
        self.hangs.stop()
        self.schedule_runner.stop()
        self.supervisor.stop()
        self.serving_applier.stop()
        self.reconciler.stop()
        if self.sso is not None:
            self.sso.close()
        self.backend.close()
        self.store.close()


def _ca(settings: config.Settings) -> bytes | None:
    """raypod's own CA (public), for nodes that verify the server's certificate; None without TLS or one."""
    path = (settings.tls_ca or settings.tls_cert) if settings.tls else None
    try:
        return path.read_bytes() if path else None
    except OSError:
        return None
