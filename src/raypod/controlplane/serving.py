"""The serving verbs the API calls: the model catalog (add, list, show, remove) and models deployed on clusters'
Ray Serve (deploy, list, status, delete).

A deploy is checked before anything starts on the cluster: the model is in the catalog, one replica fits a node
of the cluster (memory, CPUs, GPUs for vLLM), the L1 pool fits the node's object store, and the source still
holds exactly the catalogued files (sizes and checksums). Only then is a Ray job submitted that runs Serve with
the cluster's own port and the application; its status is Serve's own, read from the cluster's dashboard.
"""

from __future__ import annotations

import builtins
import logging
import secrets
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from raypod import errors, outbound, state
from raypod import spec as spec_mod
from raypod.backends import base, ray_jobs
from raypod.backends.kuberay import manifests
from raypod.controlplane import identity, store
from raypod.controlplane.clusters import ClusterService
from raypod.controlplane.jobs.supervisor import INTERNAL_JOB
from raypod.controlplane.periodic import Periodic
from raypod.controlplane.store.models import CatalogStore, DeploymentStore
from raypod.serving import catalog
from raypod.serving.catalog import AdditionStatus
from raypod.serving.deploy import encode
from raypod.serving.settings import DeployRequest, ServeSettings
from raypod.state import DeploymentStatus as Status

log = logging.getLogger(__name__)

LOG_TAIL_CHARS = 1500
RAYSERVICE = "rayservice/"  # a deployment's deploy_job when a RayService runs it: "rayservice/<its name>"


# fsspec protocols a catalog source may use: object stores, the hub, the server's own files (admins only, as every
# source), and plain HTTP(S). Others (ssh, ftp, smb, git, ...) would reach hosts outside the fetch policy.
SOURCE_SCHEMES = frozenset({"", "file", "memory", "hf", "s3", "s3a", "gs", "gcs", "az", "abfs", "http", "https"})


class ModelCatalog:
    def __init__(self, db: store.Store, outbound_policy: outbound.Policy | None = None) -> None:
        self.records = CatalogStore(db.engine)
        self.outbound = outbound_policy or outbound.Policy()
        self.wake: Callable[[], None] = lambda: None  # starts the serving applier's next pass now

    def add(
        self, caller: identity.Principal, source: catalog.ModelSource, replace: bool = False
    ) -> catalog.ModelAddition:
        """Ask for ``source`` to be added: the serving applier reads and checksums it (minutes for a large model),
        so the answer is the request, INSPECTING. Installation admins only: the server reads the source with its
        own rights and network (its files, its cloud credentials), and the catalog is shared by every team (a
        well-known id is not for anyone to take).

        Raises:
            Conflict (the id exists, not replacing; it is being added), Forbidden (not an admin; a source the
            outbound policy refuses), InvalidSpec (a source scheme raypod does not read)."""
        if not caller.is_admin:
            raise errors.Forbidden(
                "only installation admins add models to the catalog (the server reads the source with its own "
                "rights): ask an admin to add it"
            )
        self._check_source(source)
        existing = self._find(source.id)
        if existing is not None:
            if not replace:
                raise errors.Conflict(f"model '{source.id}' is already in the catalog (add --replace to update it)")
            self._check_owner(caller, existing)
        pending = self.records.addition(source.id)
        if pending is not None and pending["failure"] is None:
            raise errors.Conflict(
                f"model '{source.id}' is being added (by {pending['requested_by']}): see `raypod model show "
                f"{source.id}`"
            )
        self.records.request(source, replace=existing is not None, by=caller.user, at=store.now())
        self.wake()
        return self.addition(source.id)

    def addition(self, model_id: str) -> catalog.ModelAddition:
        """How far adding ``model_id`` is: INSPECTING, FAILED (with why) or ADDED (with the entry)."""
        request = self.records.addition(model_id)
        if request is not None:
            source = catalog.ModelSource.model_validate_json(request["source"])
            return catalog.ModelAddition(
                id=model_id,
                status=AdditionStatus.FAILED if request["failure"] else AdditionStatus.INSPECTING,
                source=source.source,
                requested_by=request["requested_by"],
                requested_at=store.aware(request["requested_at"]),
                failure=request["failure"],
            )
        entry = self.get(model_id)
        return catalog.ModelAddition(
            id=model_id,
            status=AdditionStatus.ADDED,
            source=entry.source,
            requested_by=entry.added_by,
            requested_at=entry.added_at or store.now(),
            entry=entry,
        )

    def inspect_pending(self) -> None:
        """The serving applier's part for the catalog: read and checksum each requested source into its entry,
        or record why it cannot be read."""
        for request in self.records.additions():
            source = catalog.ModelSource.model_validate_json(request["source"])
            try:
                self._check_source(source)  # the policy may have changed since the request
                entry = catalog.inspect(source)
            except catalog.CatalogError as exc:
                self.records.addition_failed(request, str(exc)[:LOG_TAIL_CHARS])
                continue
            except errors.RaypodError as exc:
                self.records.addition_failed(request, exc.message[:LOG_TAIL_CHARS])
                continue
            added = {"added_by": request["requested_by"], "added_at": store.now(), "warnings": []}
            self.records.added(request, entry.model_copy(update=added))

    def list(self) -> builtins.list[catalog.ModelEntry]:
        return self.records.list()

    def get(self, model_id: str) -> catalog.ModelEntry:
        entry = self._find(model_id)
        if entry is None:
            raise errors.NotFound(
                f"model '{model_id[:130]}' is not in the catalog (see `raypod model list`; add it with "
                "`raypod model add`)"
            )
        return entry

    def remove(self, caller: identity.Principal, model_id: str) -> catalog.ModelAddition:
        """Remove the entry, or withdraw a request to add it (one that failed, or is still being read)."""
        addition = self.addition(model_id)
        if addition.entry is not None:
            self._check_owner(caller, addition.entry)
        elif not caller.is_admin and addition.requested_by != caller.user:
            raise errors.Forbidden(
                f"model '{model_id}' was asked for by {addition.requested_by}: only they or an admin withdraw it"
            )
        self.records.delete(model_id)
        return addition

    def _find(self, model_id: str) -> catalog.ModelEntry | None:
        return self.records.get(model_id)

    def _check_source(self, source: catalog.ModelSource) -> None:
        """The outbound policy on where the source lives: an http(s) URL, or an object store's endpoint."""
        scheme = urlsplit(source.source).scheme.lower() if "://" in source.source else ""
        if scheme not in SOURCE_SCHEMES:
            schemes = ", ".join(sorted(SOURCE_SCHEMES - {""}))
            raise errors.InvalidSpec(f"a model source is a directory, a Hugging Face id or a URL of: {schemes}")
        if scheme in ("http", "https"):
            outbound.check_url(source.source, self.outbound)
        client_kwargs = source.storage_options.get("client_kwargs")
        endpoints = [source.storage_options.get("endpoint_url")]
        if isinstance(client_kwargs, dict):
            endpoints.append(client_kwargs.get("endpoint_url"))
        for endpoint in endpoints:
            if endpoint is not None:
                outbound.check_url(str(endpoint), self.outbound)

    def _check_owner(self, caller: identity.Principal, entry: catalog.ModelEntry) -> None:
        if not caller.is_admin and entry.added_by != caller.user:
            raise errors.Forbidden(f"model '{entry.id}' was added by {entry.added_by}: only they or an admin change it")


class ServingService:
    def __init__(
        self,
        clusters: ClusterService,
        models: ModelCatalog,
        staging_url: str | None = None,
        staging_options: dict[str, Any] | None = None,
    ) -> None:
        self.clusters = clusters
        self.models = models
        # Object storage for models on the server's disk that a cluster's nodes cannot read (Settings).
        self.staging_url = staging_url
        self.staging_options = staging_options or {}
        self.records = DeploymentStore(clusters.store.engine)
        # Starts the applier's next pass at once; the control plane sets it to the applier's own.
        self.wake: Callable[[], None] = lambda: None

    def node_visibility_warnings(self, entry: catalog.ModelEntry) -> builtins.list[str]:
        """What would refuse deploying ``entry`` on any cluster: a directory that sandboxed nodes do not see."""
        local_path = catalog.local_path(entry.source)
        hidden = local_path and self.clusters.backend.hidden_from_nodes("", local_path)
        if not hidden or self.staging_url:
            return []
        return [
            f"the clusters' nodes cannot read {local_path} ({hidden}): a deploy of {entry.id} will be refused; "
            "add it from another directory, or from S3"
        ]

    def deploy(
        self, caller: identity.Principal, namespace: str, cluster: str, spec: spec_mod.ServeDeploySpec
    ) -> state.DeploymentView:
        """Store the deployment (NOT_STARTED); the serving applier checks the model's files and submits it on
        its next pass, which this starts at once. What can be told at once is refused here.

        Raises:
            NotFound (cluster, model), Forbidden, InvalidSpec (does not fit, files the nodes cannot read, no L2),
            Conflict (no dashboard or Serve endpoint yet)."""
        view = self.clusters.get(caller, namespace, cluster, identity.Verb.OPERATE)
        entry = self.models.get(spec.model)
        engine, _ = _fit(view.spec, entry, spec)
        self._check_reachable(view)
        self._check_visible(view, entry, cluster)
        if spec.kv_cache and spec.l2 is None and base.Feature.KV_STORE not in self.clusters.backend.features:
            raise errors.InvalidSpec("raypod runs no Redis on this backend: give the KV cache an L2 address")
        name = spec.app_name()
        record = {
            "cluster_uid": view.uid,
            "name": name,
            "namespace": namespace,
            "cluster": cluster,
            "model": entry.id,
            "owner": caller.user,
            "spec": spec.model_dump_json(),
            "engine": engine,
            "deploy_job": "",
            "created_at": store.now(),
            "failure": None,
            "delete_requested": False,
        }
        self.records.save(view.uid, name, {k: v for k, v in record.items() if k not in ("cluster_uid", "name")})
        self.wake()
        return self._observed(view, record, None)

    def list(self, caller: identity.Principal, namespace: str, cluster: str) -> builtins.list[state.DeploymentView]:
        view = self.clusters.get(caller, namespace, cluster)
        records = self._records(view.uid)
        if not records:  # no need to ask the dashboard (the console asks every few seconds)
            return []
        serve = self._serve_status(view) if any(_on_cluster(r) for r in records) else None
        return [self._observed(view, record, serve) for record in records]

    def get(self, caller: identity.Principal, namespace: str, cluster: str, name: str) -> state.DeploymentView:
        view = self.clusters.get(caller, namespace, cluster)
        for record in self._records(view.uid, name):
            return self._observed(view, record, self._serve_status(view) if _on_cluster(record) else None)
        raise errors.NotFound(f"no model deployment '{name[:64]}' on cluster {namespace}/{cluster}")

    def delete(self, caller: identity.Principal, namespace: str, cluster: str, name: str) -> state.DeploymentView:
        """Ask for the deployment to go: the applier removes it from Serve (a RayService: deletes it) and forgets
        it on its next pass, which this starts at once."""
        deployment = self.get(caller, namespace, cluster, name)
        view = self.clusters.get(caller, namespace, cluster, identity.Verb.OPERATE)
        self.records.request_delete(view.uid, name)
        self.wake()
        return deployment.model_copy(update={"status": Status.DELETING})

    def apply_pending(self) -> None:
        """The serving applier's pass for deployments: submit what was asked for, remove what was deleted. A
        cluster not ready (no dashboard, a transient error) is tried again next pass; anything else fails the
        deployment with why."""
        for record in self.records.pending():
            uid, name = record["cluster_uid"], record["name"]
            try:
                view = self.clusters.store.get(record["namespace"], record["cluster"])
            except errors.NotFound:
                view = None
            if view is None or view.uid != uid:  # its cluster is gone
                self.records.delete(uid, name)
                continue
            try:
                if record["delete_requested"]:
                    self._undeploy(view, record)
                else:
                    self.records.applied(record, {"deploy_job": self._apply(view, record)})
            except (errors.TransientError, errors.Conflict) as exc:
                log.info("deployment %s of %s/%s waits: %s", name, view.spec.namespace, view.spec.name, exc.message)
            except errors.RaypodError as exc:
                if record["delete_requested"]:
                    log.warning("deployment %s: cannot remove it yet: %s", name, exc.message)
                else:
                    self.records.applied(record, {"failure": exc.message[:LOG_TAIL_CHARS]})

    def _apply(self, view: state.ClusterView, record: dict[str, Any]) -> str:
        """Check the model's files (sizes and checksums: slow for large models), start the KV cache's store if
        raypod runs it, and submit the deployment; returns its ``deploy_job``."""
        spec = spec_mod.ServeDeploySpec.model_validate_json(record["spec"])
        entry = self.models.get(spec.model)
        engine, l1_bytes = _fit(view.spec, entry, spec)
        runner = self._runner()
        port = 0 if runner else _port(view.status.endpoints.get("serve"))
        api = None if runner else self._api(view)
        try:
            catalog.verify(entry)
        except catalog.CatalogError as exc:
            raise errors.InvalidSpec(f"cannot deploy: {exc}") from None
        entry = self._visible(view, entry, view.spec.name)
        settings = ServeSettings(
            entry=entry,
            kv_cache=spec.kv_cache,
            l1_bytes=l1_bytes,
            chunk_tokens=spec.chunk_tokens,
            reserve_tokens=spec.reserved_tokens(entry.max_context) if engine == "cpu" else 0,
        )
        if spec.kv_cache and spec.l2 is None:
            settings.l2_url_file = self.clusters.backend.kv_store(view.uid, spec.l2_bytes)
        elif spec.kv_cache and spec.l2 != "none":
            settings.l2_url = spec.l2
        request = DeployRequest(
            action="deploy",
            name=record["name"],
            http_port=port,
            engine=engine,
            settings=settings,
            options=_options(spec, entry),
        )
        if runner is not None:
            body = request.model_dump(mode="json")
            manifest = manifests.rayservice(view.spec, record["name"], body, kueue=runner.kueue)
            runner.apply_rayservice(view.uid, manifest)
            return RAYSERVICE + str(manifest["metadata"]["name"])
        assert api is not None
        return self._submit(api, request)

    def _undeploy(self, view: state.ClusterView, record: dict[str, Any]) -> None:
        submitted: str = record["deploy_job"]
        runner = self._runner()
        if submitted.startswith(RAYSERVICE) and runner is not None:
            runner.delete_rayservice(view.spec.namespace, submitted.removeprefix(RAYSERVICE))
        elif submitted:
            self._submit(self._api(view), DeployRequest(action="delete", name=record["name"]))
        self.records.delete(view.uid, record["name"])

    def _check_reachable(self, view: state.ClusterView) -> None:
        """Raises Conflict while the cluster cannot take a deployment: no dashboard, no Serve endpoint."""
        if self._runner() is None:
            self._api(view)
            _port(view.status.endpoints.get("serve"))

    def _visible(self, view: state.ClusterView, entry: catalog.ModelEntry, cluster: str) -> catalog.ModelEntry:
        """``entry`` as the cluster's nodes can read it: where they cannot read the server's directory, a copy in
        the staging object store (made by the serving applier: minutes for a large model), else a refusal."""
        if not self._check_visible(view, entry, cluster):
            return entry
        try:
            return catalog.copy_to_store(entry, str(self.staging_url), self.staging_options)
        except catalog.CatalogError as exc:
            raise errors.TransientError(str(exc)) from None

    def _check_visible(self, view: state.ClusterView, entry: catalog.ModelEntry, cluster: str) -> bool:
        """Whether ``entry`` needs a copy in the staging store. Raises InvalidSpec where it needs one and there is
        no staging store."""
        local_path = catalog.local_path(entry.source)
        hidden = local_path and self.clusters.backend.hidden_from_nodes(view.uid, local_path)
        if not hidden:
            return False
        if self.staging_url:
            return True
        raise errors.InvalidSpec(
            f"cannot deploy: model {entry.id} is read from {local_path}, which the nodes of cluster {cluster} "
            f"cannot read ({hidden}): add it from another directory or from S3, or have the server copy it to "
            "object storage (RAYPOD_MODEL_STAGING_URL)"
        )

    # -- internals ---------------------------------------------------------------------------------------

    def _runner(self) -> base.ServiceRunner | None:
        """The backend, where it serves each deployment as its own RayService (Kubernetes)."""
        backend = self.clusters.backend
        return backend if isinstance(backend, base.ServiceRunner) else None

    def _api(self, view: state.ClusterView) -> ray_jobs.RayJobApi:
        url = view.status.endpoints.get("dashboard")
        if not url or view.deleting:
            raise errors.Conflict(f"cluster {view.spec.namespace}/{view.spec.name} has no running dashboard yet")
        return self.clusters.backend.job_api(view.uid, url)

    def _submit(self, api: ray_jobs.RayJobApi, request: DeployRequest) -> str:
        submission = f"rs-{request.action}-{request.name}-{secrets.token_hex(4)}"
        api.submit(
            {
                "entrypoint": f"python -m raypod.serving.deploy {encode(request)}",
                "submission_id": submission,
                "metadata": {INTERNAL_JOB: f"serve-{request.action}", "raypod_deployment": request.name},
            }
        )
        return submission

    def _records(self, uid: str, name: str | None = None) -> builtins.list[dict[str, Any]]:
        return self.records.of_cluster(uid, name)

    def _serve_status(self, view: state.ClusterView) -> dict[str, Any] | None:
        """Serve's applications, or None when the dashboard cannot say (then every status is UNKNOWN)."""
        try:
            return self._api(view).serve_applications()
        except (errors.TransientError, errors.Conflict, errors.InvalidSpec, errors.NotFound):
            return None

    def _observed(
        self, view: state.ClusterView, record: dict[str, Any], serve: dict[str, Any] | None
    ) -> state.DeploymentView:
        name = record["name"]
        deployment = state.DeploymentView(
            name=name,
            namespace=record["namespace"],
            cluster=record["cluster"],
            model=record["model"],
            owner=record["owner"],
            spec=spec_mod.ServeDeploySpec.model_validate_json(record["spec"]),
            created_at=record["created_at"],
            engine=record["engine"],
            openai_base_url=f"/clusters/{record['namespace']}/{record['cluster']}/serve/{name}/v1",
            deploy_job=record["deploy_job"],
        )
        if record.get("delete_requested"):
            deployment.status, deployment.message = Status.DELETING, "raypod is removing it from Serve"
            return deployment
        if record.get("failure"):
            deployment.status, deployment.message = Status.DEPLOY_FAILED, str(record["failure"])
            return deployment
        if not deployment.deploy_job:
            deployment.status, deployment.message = (
                Status.NOT_STARTED,
                "raypod checks the model's files, then submits it",
            )
            return deployment
        if deployment.deploy_job.startswith(RAYSERVICE):
            return self._from_rayservice(deployment)
        if serve is None:
            deployment.status, deployment.message = (
                Status.UNKNOWN,
                "the cluster's dashboard does not answer",
            )
            return deployment
        app = (serve.get("applications") or {}).get(name)
        if app is None:
            return self._from_job(view, deployment)
        deployment.status = Status.of_serve(app.get("status"))
        deployment.message = str(app.get("message") or "")[:LOG_TAIL_CHARS]
        for detail in (app.get("deployments") or {}).values():
            for replica in detail.get("replicas") or []:
                deployment.replicas.append(
                    state.ServeReplica(
                        id=str(replica.get("replica_id", "")),
                        state=str(replica.get("state", "")),
                        node_id=replica.get("node_id"),
                        pid=replica.get("pid"),
                    )
                )
            if not deployment.message and detail.get("message"):
                deployment.message = str(detail["message"])[:LOG_TAIL_CHARS]
        if deployment.status == Status.RUNNING and deployment.message == "":
            running = sum(r.state == "RUNNING" for r in deployment.replicas)
            deployment.message = f"{running} replica{'' if running == 1 else 's'} running"
        if deployment.status == Status.DEPLOYING:
            failed = self._from_job(view, deployment)
            if failed.status == Status.DEPLOY_FAILED:
                return failed
        return deployment

    def _from_rayservice(self, deployment: state.DeploymentView) -> state.DeploymentView:
        """Serve's status of the application as KubeRay reports it on the RayService."""
        runner = self._runner()
        name = deployment.deploy_job.removeprefix(RAYSERVICE)
        found = runner.rayservice_state(deployment.namespace, name) if runner is not None else None
        if found is None:
            deployment.status = Status.UNKNOWN
            deployment.message = f"RayService {deployment.namespace}/{name} is not visible to raypod (yet)"
            return deployment
        deployment.status = Status.of_serve(found.status)
        deployment.message = found.message[:LOG_TAIL_CHARS]
        if not deployment.message and found.deployments:
            healthy = sum(status == "HEALTHY" for status in found.deployments.values())
            deployment.message = f"RayService {name}: {healthy} of {len(found.deployments)} deployments healthy"
        return deployment

    def _from_job(self, view: state.ClusterView, deployment: state.DeploymentView) -> state.DeploymentView:
        """Before Serve knows the application (or after it failed to build), the deploy job says how it went."""
        try:
            api = self._api(view)
            info = api.info(deployment.deploy_job)
            status = str(info.get("status", ""))
            if status == "FAILED":
                logs = api.logs(deployment.deploy_job)
                deployment.status = Status.DEPLOY_FAILED
                deployment.message = _last_error(logs) or str(info.get("message", ""))[:LOG_TAIL_CHARS]
            elif status in ("PENDING", "RUNNING"):
                deployment.status, deployment.message = (
                    Status.DEPLOYING,
                    "starting Serve and the replicas",
                )
            else:
                deployment.status, deployment.message = (
                    Status.NOT_RUNNING,
                    f"the application is gone from Serve ({status})",
                )
        except (errors.TransientError, errors.Conflict, errors.InvalidSpec, errors.NotFound):
            deployment.status, deployment.message = Status.UNKNOWN, "the deploy job cannot be read"
        return deployment


def _on_cluster(record: dict[str, Any]) -> bool:
    """Whether the deployment was submitted to the cluster's own Serve (not a RayService, not yet, not deleting)."""
    job = str(record["deploy_job"])
    return bool(job) and not job.startswith(RAYSERVICE) and not record.get("delete_requested")


def _fit(cluster: spec_mod.ClusterSpec, entry: catalog.ModelEntry, spec: spec_mod.ServeDeploySpec) -> tuple[str, int]:
    """(engine, L1 bytes). Raises InvalidSpec naming what does not fit."""
    groups = [("head", cluster.head), *((group.name, group) for group in cluster.worker_groups)]
    if not any(g.cpus >= spec.cpus for _, g in groups):
        raise errors.InvalidSpec(
            f"a replica asks for {spec.cpus:g} CPUs; the largest node of cluster {cluster.name} has "
            f"{max(g.cpus for _, g in groups)} CPUs: ask for fewer (--cpus) or give a worker group more"
        )
    memory = replica_memory(entry, spec)
    fitting = [(name, g) for name, g in groups if g.cpus >= spec.cpus and g.memory >= memory]
    if not fitting:
        largest = max(g.memory for _, g in groups)
        reserved = (
            f", and keys and values for {spec.reserved_tokens(entry.max_context)} tokens"
            if memory > entry.memory_bytes
            else ""
        )
        raise errors.InvalidSpec(
            f"model {entry.id} needs {spec_mod.format_bytes(memory)} of memory per replica "
            f"({entry.parameters / 1e6:.1f}M parameters in {entry.dtype}{reserved}); the largest node of cluster "
            f"{cluster.name} schedules {spec_mod.format_bytes(largest)}: give a worker group more `memory`, "
            f"{'lower reserve_tokens, ' if reserved else ''}or deploy a smaller model"
        )
    with_gpus = [g for _, g in fitting if g.gpus > 0]
    engine = spec.engine if spec.engine != "auto" else ("vllm" if with_gpus else "cpu")
    if engine == "vllm" and not with_gpus:
        raise errors.InvalidSpec(f"the vLLM engine needs GPUs; no node group of cluster {cluster.name} has any")
    store_bytes = min(g.object_store_memory for _, g in fitting)
    l1_bytes = spec.l1_bytes if spec.l1_bytes is not None else store_bytes // 2
    if spec.kv_cache and l1_bytes > store_bytes:
        raise errors.InvalidSpec(
            f"an L1 pool of {spec_mod.format_bytes(l1_bytes)} does not fit the object store of the nodes that can "
            f"serve this model ({spec_mod.format_bytes(store_bytes)}): raise `object_store_memory` or lower l1_bytes"
        )
    return engine, l1_bytes


def replica_memory(entry: catalog.ModelEntry, spec: spec_mod.ServeDeploySpec) -> int:
    """The model's memory, plus what the CPU engine reserves at start: its pool of keys and values, and as much
    again to read a prefix from L2 into."""
    if spec.engine == "vllm":
        return entry.memory_bytes
    copies = 2 if spec.kv_cache and spec.l2 != "none" else 1
    return entry.memory_bytes + copies * entry.kv_bytes_per_token * spec.reserved_tokens(entry.max_context)


def _options(spec: spec_mod.ServeDeploySpec, entry: catalog.ModelEntry) -> dict[str, Any]:
    options: dict[str, Any] = {
        "ray_actor_options": {"num_cpus": spec.cpus, "memory": replica_memory(entry, spec)},
        # The CPU engine answers one request at a time: more queued at one replica would wait while others idle.
        "max_ongoing_requests": 2,
    }
    if spec.autoscale:
        low, high = spec.autoscale
        options["autoscaling_config"] = {"min_replicas": low, "max_replicas": high, "target_ongoing_requests": 2}
    else:
        options["num_replicas"] = spec.replicas
    return options


def _port(url: str | None) -> int:
    if not url:
        raise errors.Conflict("this cluster has no Serve endpoint yet")
    return int(url.rsplit(":", 1)[1].split("/", 1)[0])


def _last_error(logs: str) -> str:
    """The end of a failed deploy job's traceback: the line that says what went wrong."""
    lines = [line for line in logs.strip().splitlines() if line.strip()]
    for line in reversed(lines):
        if "Error" in line or "Exception" in line or "failed" in line.lower():
            return line.strip()[:LOG_TAIL_CHARS]
    return "\n".join(lines[-3:])[:LOG_TAIL_CHARS]


class ServingApplier(Periodic):
    """A thread that applies serving's stored desired state every ``interval_s``: catalog additions
    (``ModelCatalog.inspect_pending``), then deployments (``ServingService.apply_pending``). The one place a
    model's files are read and a deployment reaches a cluster: no request thread checksums or starts anything."""

    thread_name = "raypod-serving"

    def __init__(self, serving: ServingService, interval_s: float = 1.0) -> None:
        super().__init__(interval_s)
        self.serving = serving

    def run_once(self) -> None:
        self.serving.models.inspect_pending()
        self.serving.apply_pending()
