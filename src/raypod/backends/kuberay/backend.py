"""The Kubernetes backend: a raypod cluster is a KubeRay ``RayCluster`` in the Kubernetes namespace named as its raypod
namespace, and KubeRay runs its pods.

raypod applies the spec (``apply``), reads the RayCluster and its pods back through two watches (``Informer``),
names pods as raypod names nodes (``head``, ``<group>-<i>`` by age), and replaces a node by deleting its pod, which
KubeRay recreates. It never starts a pod itself: ``create_node`` is KubeRay's job once the RayCluster asks for it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException

from raypod import errors, state
from raypod import spec as spec_mod
from raypod.backends import base, ray_jobs
from raypod.backends.commands import CommandResult
from raypod.backends.kuberay import api_errors, manifests
from raypod.backends.kuberay import pods as pods_mod
from raypod.backends.kuberay.informer import Informer, Key
from raypod.backends.kuberay.kvstore import KvStores
from raypod.backends.kuberay.objects import Objects, merge_patch
from raypod.backends.kuberay.podexec import PodExec
from raypod.backends.kuberay.pods import observed_nodes
from raypod.backends.kuberay.sidecars import AddonObjects
from raypod.backends.kuberay.taints import QUARANTINE_TAINT, NodeQuarantine
from raypod.backends.kuberay.tokens import UID_LABEL, RayTokens
from raypod.backends.kuberay.workloads import RayWorkloads

__all__ = ["QUARANTINE_TAINT", "UID_LABEL", "Informer", "KubeRayBackend", "observed_nodes"]

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL = "ray.io", "v1", "rayclusters"
SPEC_HASH_ANNOTATION = "raypod.io/spec-hash"
AWAIT_REMINDER_S = 300.0
MANAGED_SELECTOR = "app.kubernetes.io/managed-by=raypod"
RAY_POD_SELECTOR = "ray.io/is-ray-node=yes"
DASHBOARD_PORT, GCS_PORT = 8265, 6379
# Every verb this backend uses, as the Helm chart's (Cluster)Role grants them (a test holds the two together).
RBAC_RULES = (
    {"apiGroups": ["ray.io"], "resources": ["rayclusters"], "verbs": ["list", "watch", "create", "patch", "delete"]},
    {"apiGroups": ["ray.io"], "resources": ["rayjobs"], "verbs": ["list", "watch", "create", "delete"]},
    {"apiGroups": ["ray.io"], "resources": ["rayservices"], "verbs": ["list", "watch", "create", "patch", "delete"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch", "delete"]},
    {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create"]},  # user health checks in the Ray container
    # Each cluster's Ray token; its sidecars' tokens and credentials; the managed L2's password.
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create", "patch", "delete"]},
    # Node add-ons (objects.py): their files, a workspace's IDE Service and files' claim, the managed L2.
    {"apiGroups": [""], "resources": ["configmaps", "services"], "verbs": ["get", "create", "patch", "delete"]},
    {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["get", "create", "patch", "delete"]},
    {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "create", "patch", "delete"]},
    {
        "apiGroups": ["networking.k8s.io"],
        "resources": ["networkpolicies"],
        "verbs": ["get", "create", "patch", "delete"],
    },
)
# Cluster-scoped, so always in a ClusterRole: reading KubeRay's installed CRD tells which spec fields it serves.
CRD_RULE = {
    "apiGroups": ["apiextensions.k8s.io"],
    "resources": ["customresourcedefinitions"],
    "resourceNames": ["rayclusters.ray.io"],
    "verbs": ["get"],
}
# Cluster-scoped too: a Kubernetes node where raypod's pods keep failing is tainted for a while (QUARANTINE_TAINT).
NODE_RULE = {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]}


class KubeRayBackend(RayWorkloads):
    """Backend protocol on the official Kubernetes client; see the module docstring."""

    features = frozenset(
        {
            base.Feature.DECLARATIVE,
            base.Feature.CHANGE_EVENTS,
            base.Feature.GCS_FAULT_TOLERANCE,
            base.Feature.SPACES,
            base.Feature.HANGWATCH,
            base.Feature.NODE_COMMANDS,
            base.Feature.KV_STORE,
            base.Feature.AUTOSCALING,
        }
    )
    tenancy = base.Tenancy(
        isolated=True,
        summary="each raypod namespace is a Kubernetes namespace: pods, services and secrets are separated by "
        "Kubernetes RBAC and, where the cluster enforces them, network policies",
    )

    def __init__(
        self,
        api: client.ApiClient,
        *,
        in_cluster: bool = False,
        request_timeout_s: float = 10.0,
        watch: bool = True,
        kueue: bool = False,
    ) -> None:
        self._api = api
        self.kueue = kueue  # label RayClusters and RayJobs for Kueue, which then admits them
        self._custom = client.CustomObjectsApi(api)
        self._core = client.CoreV1Api(api)
        self._in_cluster = in_cluster
        self._timeout = request_timeout_s
        self._lock = threading.Lock()
        self._pods_by_cluster: dict[Key, dict[str, dict[str, Any]]] = {}
        self._known: dict[str, Key] = {}  # cluster uid -> (namespace, name)
        self._last: dict[str, state.ObservedCluster] = {}
        self._awaited: dict[tuple[str, str], float] = {}  # (cluster, node) -> when its pod was first awaited
        self._schema: dict[str, Any] | None = None
        self._tls: ssl.SSLContext | None = None
        self.quarantine = NodeQuarantine(self._core, request_timeout_s)
        self.objects = Objects(api, request_timeout_s)
        self.tokens = RayTokens(self.objects)
        self.addon_objects = AddonObjects(self.objects)
        self.podexec = PodExec(api.configuration)
        self.kv = KvStores(self.objects)
        self._kv_clusters: set[str] = set()  # clusters whose model deployments use the managed L2
        self._listener: Callable[[str], None] = lambda cluster_id: None
        self.clusters = Informer(
            PLURAL,
            functools.partial(
                self._custom.list_cluster_custom_object, GROUP, VERSION, PLURAL, label_selector=MANAGED_SELECTOR
            ),
            request_timeout_s=request_timeout_s,
            on_change=self._raycluster_changed,
            on_sync_change=self._sync_changed,
        )
        self.rayjobs = Informer(
            "rayjobs",
            functools.partial(
                self._custom.list_cluster_custom_object, GROUP, VERSION, "rayjobs", label_selector=MANAGED_SELECTOR
            ),
            request_timeout_s=request_timeout_s,
        )
        self.rayservices = Informer(
            "rayservices",
            functools.partial(
                self._custom.list_cluster_custom_object, GROUP, VERSION, "rayservices", label_selector=MANAGED_SELECTOR
            ),
            request_timeout_s=request_timeout_s,
        )
        self.pods = Informer(
            "pods",
            functools.partial(self._core.list_pod_for_all_namespaces, label_selector=RAY_POD_SELECTOR),
            request_timeout_s=request_timeout_s,
            on_change=self._index_pod,
            on_sync_change=self._sync_changed,
        )
        if watch:
            self.clusters.start()
            self.rayjobs.start()
            self.rayservices.start()
            self.pods.start()

    @classmethod
    def from_environment(cls, *, kueue: bool = False) -> KubeRayBackend:
        """In a pod: its service account. Elsewhere: the kubeconfig (``KUBECONFIG`` or ``~/.kube/config``).

        Raises:
            PermanentError: neither is there.
        """
        in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
        configuration = client.Configuration()
        try:
            if in_cluster:
                kube_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            else:
                kube_config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except (kube_config.ConfigException, OSError) as exc:
            raise errors.PermanentError(
                f"no Kubernetes credentials: not in a pod and no usable kubeconfig ({exc}); set KUBECONFIG"
            ) from None
        return cls(client.ApiClient(configuration), in_cluster=in_cluster, kueue=kueue)

    # -- the protocol --------------------------------------------------------------------------------------

    def capacity(self) -> base.HostCapacity:
        return base.HostCapacity(cpus_per_node=None, memory_bytes=None, shared_memory_bytes=None, gpus_per_node=None)

    def apply(
        self,
        cluster_id: str,
        spec: spec_mod.ClusterSpec,
        *,
        deleting: bool,
        node_addons: base.NodeAddonsOf | None = None,
    ) -> None:
        """Make the RayCluster match ``spec`` (one write when it differs, none otherwise), or delete it.

        Raises:
            TransientError: the API server cannot be reached or the object changed under us (409): next pass.
            PermanentError: RBAC forbids it, KubeRay's CRD is missing, a RayCluster of that name is not ours.
        """
        where = (spec.namespace, spec.name)
        with self._lock:
            self._known[cluster_id] = where
        if not self.clusters.synced:
            raise errors.TransientError(f"RayClusters are not visible yet: {self.clusters.error or 'listing'}")
        current = self.clusters.get(*where)
        if current is not None and current["metadata"].get("labels", {}).get(UID_LABEL) != cluster_id:
            raise errors.PermanentError(
                f"a RayCluster {spec.name} in namespace {spec.namespace} exists that this raypod cluster did not "
                "create; delete it or choose another name"
            )
        if deleting:
            if current is not None and not current["metadata"].get("deletionTimestamp"):
                self._call(f"delete RayCluster {spec.namespace}/{spec.name}", self._delete_raycluster, *where)
            self.tokens.delete(cluster_id, where)
            self.addon_objects.delete(cluster_id, spec)
            self.kv.delete(cluster_id, *where)
            with self._lock:
                self._kv_clusters.discard(cluster_id)
            return
        desired = rendered(cluster_id, spec, kueue=self.kueue, node_addons=node_addons)
        schema = self._installed_schema()
        unknown = manifests.unknown_fields(desired["spec"], schema) if schema else []
        if unknown:
            raise errors.PermanentError(
                f"the installed KubeRay does not serve spec field {unknown[0]} (its CRD lacks it; the API server would "
                "drop it): upgrade the KubeRay operator, or leave the field out"
            )
        self.tokens.get(cluster_id, where)  # the Secrets first: KubeRay's pods cannot start without them
        if node_addons is not None:
            per_group = {group: node_addons(node) for group, node in spec.group_nodes().items()}
            self.addon_objects.apply(cluster_id, spec, per_group)
        digest = desired["metadata"]["annotations"][SPEC_HASH_ANNOTATION]
        if current is None or current["metadata"].get("annotations", {}).get(SPEC_HASH_ANNOTATION) != digest:
            self._write(PLURAL, "RayCluster", current, desired)

    def set_change_listener(self, listener: Callable[[str], None]) -> None:
        self._listener = listener

    def observe(self, cluster_id: str) -> state.ObservedCluster:
        self.quarantine.lift_expired()
        with self._lock:
            where = self._known.get(cluster_id)
        if where is None:
            where = self._find(cluster_id)
        if not (self.clusters.synced and self.pods.synced):
            return self._unknown(cluster_id, self.clusters.error or self.pods.error or "the watches are starting")
        if where is None:
            return state.ObservedCluster()
        raycluster = self.clusters.get(*where)
        with self._lock:
            pods = list(self._pods_by_cluster.get(where, {}).values())
        nodes = pods_mod.observed_nodes(pods)
        with self._lock:
            for name in nodes:
                self._awaited.pop((cluster_id, name), None)
        head = next((n for n in nodes.values() if n.is_head), None)
        endpoints: dict[str, str] = {}
        if raycluster is not None and head is not None and head.phase is state.NodePhase.RUNNING:
            endpoints = self._endpoints(raycluster, where)
            ready = {node.group for node in nodes.values() if node.phase is state.NodePhase.RUNNING}
            endpoints.update(
                self.addon_objects.endpoints(cluster_id, ready, functools.partial(self._service_url, where[0]))
            )
        found = state.ObservedCluster(nodes=nodes, endpoints=endpoints)
        with self._lock:
            self._last[cluster_id] = found
        return found

    def create_node(self, cluster_id: str, node: spec_mod.NodeSpec) -> None:
        """Nothing to do: the RayCluster (``apply``) asks KubeRay for every node the spec wants. Said once (the
        pass's event), then not again until KubeRay has made its pod, but every AWAIT_REMINDER_S it has not."""
        now = time.monotonic()
        with self._lock:
            since = self._awaited.get((cluster_id, node.name))
            if since is not None and now - since < AWAIT_REMINDER_S:
                raise errors.NotYet(f"KubeRay has not made node {node.name}'s pod yet")
            self._awaited[(cluster_id, node.name)] = now

    def drain_node(self, cluster_id: str, name: str, ray_node_id: str, deadline: float, reason: str) -> None:
        raise errors.PermanentError("draining is KubeRay's on Kubernetes (its autoscaler drains before scale-down)")

    def resource_state(self, cluster_id: str) -> bytes | None:
        return None  # KubeRay's autoscaler, in the head pod, reads the demand and patches the RayCluster

    def put_cluster_kv(self, cluster_id: str, namespace: bytes, key: bytes, value: bytes) -> None:
        raise errors.PermanentError(
            "raypod does not reach a RayCluster's GCS yet: on Kubernetes a preempted run has only the pods' "
            "termination grace"
        )

    def start_sidecar(self, cluster_id: str, node: str, sidecar: str) -> None:
        raise errors.PermanentError("sidecars are containers of the pod template on Kubernetes; none is observed")

    def delete_node(self, cluster_id: str, name: str, *, quarantine_s: float = 0.0) -> None:
        """Delete the node's pod, so KubeRay starts a fresh one; while a group scales down KubeRay picks the pods
        it removes, and raypod deletes none of its own; a removed group's pods KubeRay leaves, raypod deletes."""
        with self._lock:
            where = self._known.get(cluster_id)
            pods = list(self._pods_by_cluster.get(where, {}).values()) if where else []
        pod = pods_mod.pods_by_node(pods).get(name)
        if where is None or pod is None or pod["metadata"].get("deletionTimestamp"):
            return
        group = pod["metadata"].get("labels", {}).get("ray.io/group", "")
        raycluster = self.clusters.get(*where)
        groups = {
            g["groupName"]: g.get("replicas", 0) for g in (raycluster or {}).get("spec", {}).get("workerGroupSpecs", [])
        }
        # KubeRay reconciles only the groups its spec has: the pods of a removed group (a deleted workspace's) are
        # raypod's to delete (kuberay#1739).
        if group in groups and not pods_mod.is_head(pod):
            live = sum(
                1
                for p in pods
                if p["metadata"].get("labels", {}).get("ray.io/group") == group
                and not p["metadata"].get("deletionTimestamp")
            )
            if live > groups[group]:
                return  # a scale-down: KubeRay removes the surplus pods itself
        self._call(
            f"delete pod {where[0]}/{pod['metadata']['name']}",
            self._core.delete_namespaced_pod,
            pod["metadata"]["name"],
            where[0],
            _request_timeout=self._timeout,
        )
        host = (pod.get("spec") or {}).get("nodeName")
        if quarantine_s > 0 and host:
            self.quarantine.count_failure(host, quarantine_s)

    def run_on_node(self, cluster_id: str, name: str, command: str, timeout_s: float) -> CommandResult:
        """In the node's Ray container, through ``pods/exec``. Raises NotFound (no such node), as PodExec.run."""
        where = self._known.get(cluster_id) or self._find(cluster_id)
        with self._lock:
            pods = list(self._pods_by_cluster.get(where, {}).values()) if where else []
        pod = pods_mod.pods_by_node(pods).get(name)
        if where is None or pod is None:
            raise errors.NotFound(f"node {name} has no pod")
        container = "ray-head" if pods_mod.is_head(pod) else "ray-worker"
        return self.podexec.run(where[0], pod["metadata"]["name"], container, command, timeout_s)

    def addon_dirs(self, cluster_id: str) -> dict[str, Path]:
        return {}  # node add-ons are not rendered into KubeRay's pods yet (docs/kubernetes.md)

    def sidecar_token(self, cluster_id: str, node: str, sidecar: str) -> str:
        """From the cluster's sidecar Secret. A workspace's node is its group (one pod)."""
        where = self._known.get(cluster_id) or self._find(cluster_id)
        if where is None:
            raise errors.NotFound(f"cluster {cluster_id} is not on this Kubernetes cluster")
        with self._lock:
            observed = self._last.get(cluster_id)
        found = observed.nodes.get(node) if observed else None
        group = spec_mod.HEAD_GROUP if found is not None and found.is_head else found.group if found else node
        return self.addon_objects.token(cluster_id, where[0], where[1], group, sidecar)

    def delete_bind(self, cluster_id: str, path: str) -> None:
        """The directory's PersistentVolumeClaim, in the cluster's namespace."""
        where = self._known.get(cluster_id) or self._find(cluster_id)
        if where is not None:
            self.addon_objects.delete_claim(where[0], path)

    def hidden_from_nodes(self, cluster_id: str, path: str) -> str | None:
        return "the cluster's pods do not see raypod's filesystem: put the model in object storage (s3://...)"

    def kv_store(self, cluster_id: str, max_bytes: int) -> str:
        """A Valkey of the cluster's namespace (Deployment, Service, Secret, NetworkPolicy); the model deployments'
        pods mount its URL file (``apply_rayservice``)."""
        where = self._known.get(cluster_id) or self._find(cluster_id)
        if where is None:
            raise errors.TransientError("the cluster's RayCluster is not visible yet")
        path = self.kv.ensure(cluster_id, where[0], where[1], max_bytes)
        with self._lock:
            self._kv_clusters.add(cluster_id)
        return path

    def release(self, cluster_id: str) -> None:
        with self._lock:
            where = self._known.pop(cluster_id, None)
            self._last.pop(cluster_id, None)
            self._awaited = {key: at for key, at in self._awaited.items() if key[0] != cluster_id}
        if where is not None and self.clusters.get(*where) is not None:
            self._call(f"delete RayCluster {where[0]}/{where[1]}", self._delete_raycluster, *where)
        if where is not None:
            self.tokens.delete(cluster_id, where)
            self.kv.delete(cluster_id, *where)

    def dashboard_headers(self, cluster_id: str) -> dict[str, str]:
        """The cluster's Ray token in ``X-Ray-Authorization`` (Ray's header for requests through a proxy), and,
        outside the cluster, where the dashboard is reached through the API server's service proxy, raypod's
        Kubernetes credentials in ``Authorization``.

        Raises TransientError (the token's Secret cannot be read yet), PermanentError."""
        where = self._known.get(cluster_id) or self._find(cluster_id)
        headers = {"X-Ray-Authorization": f"Bearer {self.tokens.get(cluster_id, where)}"} if where else {}
        if self._in_cluster:
            return headers
        token = self._api.configuration.api_key.get("authorization") or self._api.configuration.api_key.get(
            "BearerToken"
        )
        if token:
            headers["Authorization"] = token if token.startswith("Bearer ") else f"Bearer {token}"
        return headers

    def upstream_tls(self, cluster_id: str) -> ssl.SSLContext | None:
        """Outside the cluster, endpoints are the API server's proxy: trusted as the kubeconfig trusts it (its CA,
        or none where it says ``insecure-skip-tls-verify``), with its client certificate where it has one."""
        if self._in_cluster or not self._api.configuration.host.startswith("https://"):
            return None
        if self._tls is None:
            configuration = self._api.configuration
            context = ssl.create_default_context(cafile=configuration.ssl_ca_cert or None)
            if not configuration.verify_ssl:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            if configuration.cert_file and configuration.key_file:
                context.load_cert_chain(configuration.cert_file, configuration.key_file)
            self._tls = context
        return self._tls

    def job_api(self, cluster_id: str, dashboard_url: str) -> ray_jobs.RayJobApi:
        import httpx

        client = httpx.Client(timeout=30, verify=self.upstream_tls(cluster_id) or True)
        return ray_jobs.RayJobApi(dashboard_url, self.dashboard_headers(cluster_id), client)

    def close(self) -> None:
        informers = (self.clusters, self.rayjobs, self.rayservices, self.pods)
        for informer in informers:
            informer.stop(timeout_s=0)  # all told first, then each waited for
        for informer in informers:
            informer.stop()

    # -- inside --------------------------------------------------------------------------------------------

    def _write(self, plural: str, kind: str, current: dict[str, Any] | None, desired: dict[str, Any]) -> None:
        """Create ``desired``, or patch ``current`` into it: a JSON merge patch of the spec and raypod's metadata,
        which fails with 409 if the object changed since it was read (then it is read again, next pass)."""
        namespace, name = desired["metadata"]["namespace"], desired["metadata"]["name"]
        if current is None:
            self._call(
                f"create {kind} {namespace}/{name}",
                self._custom.create_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                plural,
                desired,
                _request_timeout=self._timeout,
            )
            return
        patch = merge_patch({"spec": current.get("spec", {})}, {"spec": desired["spec"]})
        metadata = {key: desired["metadata"][key] for key in ("labels", "annotations") if key in desired["metadata"]}
        patch["metadata"] = {**metadata, "resourceVersion": current["metadata"].get("resourceVersion")}
        self._call(
            f"update {kind} {namespace}/{name}",
            self._custom.patch_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            plural,
            name,
            patch,
            _request_timeout=self._timeout,
        )

    def _call(self, doing: str, call: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return call(*args, **kwargs)
        except ApiException as exc:
            if exc.status == 404 and doing.startswith("delete"):
                return None  # already gone
            if exc.status == 409 and doing.startswith("create"):
                return None  # created meanwhile (by an earlier pass whose answer was lost): compared next pass
            raise api_errors.to_raypod(exc, doing) from None
        except Exception as exc:
            raise api_errors.to_raypod(exc, doing) from None

    def _installed_schema(self) -> dict[str, Any] | None:
        """The ``spec`` schema of the installed RayCluster CRD (read once), or None where raypod may not read it."""
        if self._schema is None:
            try:
                response = client.ApiextensionsV1Api(self._api).read_custom_resource_definition(
                    f"{PLURAL}.{GROUP}", _request_timeout=self._timeout, _preload_content=False
                )
                crd = json.loads(response.data)  # type: ignore[attr-defined]  # raw: _preload_content=False
                version = next(v for v in crd["spec"]["versions"] if v["name"] == VERSION)
                self._schema = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
            except Exception as exc:  # forbidden, absent, unreachable: the check is skipped, never the apply
                log.warning("%s; spec fields are not checked against it", api_errors.explain(exc, "read KubeRay's CRD"))
                self._schema = {}
        return self._schema or None

    def _delete_raycluster(self, namespace: str, name: str) -> None:
        self._custom.delete_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name, _request_timeout=self._timeout
        )

    def _find(self, cluster_id: str) -> Key | None:
        for item in self.clusters.items():
            if item["metadata"].get("labels", {}).get(UID_LABEL) == cluster_id:
                where = (item["metadata"]["namespace"], item["metadata"]["name"])
                with self._lock:
                    self._known[cluster_id] = where
                return where
        return None

    def _unknown(self, cluster_id: str, why: str) -> state.ObservedCluster:
        """What the API server cannot show is unknown, not gone: the nodes last seen, each UNKNOWN."""
        with self._lock:
            last = self._last.get(cluster_id, state.ObservedCluster())
        nodes = {
            name: pods_mod.unknown(node, "the Kubernetes API server cannot be watched")
            for name, node in last.nodes.items()
        }
        return state.ObservedCluster(
            nodes=nodes,
            endpoints=dict(last.endpoints),
            gcs_reachable=False,
            gcs_error=f"Kubernetes API: {why}",
        )

    def _service_url(self, namespace: str, service: str, port: int) -> str:
        """How raypod reaches a Service: its DNS name in the cluster, the API server's proxy from outside."""
        if self._in_cluster:
            return f"http://{service}.{namespace}.svc:{port}"
        host = self._api.configuration.host.rstrip("/")
        return f"{host}/api/v1/namespaces/{namespace}/services/{service}:{port}/proxy"

    def _endpoints(self, raycluster: dict[str, Any], where: Key) -> dict[str, str]:
        namespace, name = where
        service = raycluster.get("status", {}).get("head", {}).get("serviceName") or f"{name}-head-svc"
        if self._in_cluster:
            dashboard = f"http://{service}.{namespace}.svc:{DASHBOARD_PORT}"
        else:
            host = self._api.configuration.host.rstrip("/")
            dashboard = f"{host}/api/v1/namespaces/{namespace}/services/{service}:dashboard/proxy"
        return {"dashboard": dashboard, "gcs": f"{service}.{namespace}.svc:{GCS_PORT}"}

    def _index_pod(self, key: Key, pod: dict[str, Any] | None) -> None:
        namespace, pod_name = key
        changed: list[Key] = []
        with self._lock:
            if pod is None:
                for where, pods in self._pods_by_cluster.items():
                    if where[0] == namespace and pods.pop(pod_name, None) is not None:
                        changed.append(where)
            else:
                cluster = pod["metadata"].get("labels", {}).get("ray.io/cluster")
                if cluster:
                    self._pods_by_cluster.setdefault((namespace, cluster), {})[pod_name] = pod
                    changed.append((namespace, cluster))
        for where in changed:
            self._notify(where)

    def _raycluster_changed(self, key: Key, item: dict[str, Any] | None) -> None:
        self._notify(key)

    def _sync_changed(self, synced: bool) -> None:
        """A watch failed or recovered: every cluster's observation turns unknown, or known again."""
        with self._lock:
            known = list(self._known)
        for cluster_id in known:
            self._listener(cluster_id)

    def _notify(self, where: Key) -> None:
        with self._lock:
            found = [uid for uid, key in self._known.items() if key == where]
        for cluster_id in found:
            self._listener(cluster_id)


def rendered(
    cluster_id: str,
    spec: spec_mod.ClusterSpec,
    *,
    kueue: bool = False,
    node_addons: base.NodeAddonsOf | None = None,
) -> dict[str, Any]:
    """The RayCluster raypod applies: the manifest the console shows, plus the cluster's uid and the manifest's
    digest (so an unchanged spec costs no write)."""
    manifest = manifests.raycluster(spec, kueue=kueue, node_addons=node_addons)
    digest = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:16]
    manifest["metadata"]["labels"][UID_LABEL] = cluster_id
    manifest["metadata"].setdefault("annotations", {})[SPEC_HASH_ANNOTATION] = digest
    return manifest
