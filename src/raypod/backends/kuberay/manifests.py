"""Pure functions: ClusterSpec -> KubeRay ``ray.io/v1`` objects. Shared by ``--dry-run``, the API and the console."""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable
from typing import Any

import yaml

from raypod import addons, errors
from raypod import spec as spec_mod
from raypod.backends.kuberay import addons as pod_addons

NodeAddons = Callable[[spec_mod.NodeSpec], addons.NodeAddons]

API_VERSION = "ray.io/v1"
DEFAULT_IMAGE = "rayproject/ray:{version}"


def raycluster(
    spec: spec_mod.ClusterSpec, *, kueue: bool = False, node_addons: NodeAddons | None = None
) -> dict[str, Any]:
    """Return the ``RayCluster`` that runs ``spec`` on Kubernetes; ``kueue``: labelled for Kueue to queue it (its
    namespace's ``raypod`` LocalQueue, the spec's priority class); ``node_addons``: what the capabilities add to a
    node of each group (hang detection's agent, a workspace's IDE), rendered into the group's pod template. Each
    workspace is a worker group of its own: zero CPUs, one replica while it runs, none while it is stopped."""
    metadata: dict[str, Any] = {
        "name": spec.name,
        "namespace": spec.namespace,
        "labels": {"app.kubernetes.io/managed-by": "raypod", **(kueue_labels(spec.priority) if kueue else {})},
    }
    if spec.owner:
        metadata["annotations"] = {_OWNER_ANNOTATION: spec.owner}
    if spec.priority != "normal":
        metadata.setdefault("annotations", {})[_PRIORITY_ANNOTATION] = spec.priority
    if spec.runtime_env:
        metadata.setdefault("annotations", {})[_RUNTIME_ENV_ANNOTATION] = json.dumps(spec.runtime_env, sort_keys=True)
    hangwatch = spec.hangwatch.model_dump(mode="json", exclude_defaults=True)
    if hangwatch:
        metadata.setdefault("annotations", {})[_HANGWATCH_ANNOTATION] = json.dumps(hangwatch, sort_keys=True)
    body: dict[str, Any] = {
        "rayVersion": spec.ray_version,
        "enableInTreeAutoscaling": any(
            g.effective_min_replicas != g.effective_max_replicas for g in spec.worker_groups
        ),
        "headGroupSpec": {
            "rayStartParams": _ray_start_params(spec.head, is_head=True),
            "template": _pod_template(spec, spec.head, "ray-head", head=True),
        },
        "workerGroupSpecs": [
            {
                "groupName": group.name,
                "replicas": group.replicas,
                "minReplicas": group.effective_min_replicas,
                "maxReplicas": group.effective_max_replicas,
                "rayStartParams": _ray_start_params(group, is_head=False),
                "template": _pod_template(spec, group, "ray-worker", head=False),
            }
            for group in spec.worker_groups
        ],
    }
    # KubeRay >= 1.5 takes node labels and custom resources as group fields and passes them to `ray start`.
    groups: list[spec_mod.NodeGroupSpec] = [spec.head, *spec.worker_groups]
    for group, manifest in zip(groups, [body["headGroupSpec"], *body["workerGroupSpecs"]], strict=True):
        if group.labels:
            manifest["labels"] = dict(group.labels)
        if group.resources:
            manifest["resources"] = {name: f"{amount:g}" for name, amount in sorted(group.resources.items())}
    # Ray's token authentication on every Ray port (KubeRay >= 1.5.1 sets RAY_AUTH_MODE and RAY_AUTH_TOKEN in each
    # container). The Secret is raypod's own, so that its gateway can present the token.
    body["authOptions"] = {"mode": "token", "secretName": auth_secret_name(spec.name)}
    if spec.suspend_after_idle_s is not None:
        metadata.setdefault("annotations", {})[_SUSPEND_ANNOTATION] = str(spec.suspend_after_idle_s)
    if spec.autoscaling is not None:
        body["autoscalerOptions"] = {
            "idleTimeoutSeconds": spec.autoscaling.idle_timeout_s,
            "upscalingMode": spec.autoscaling.upscaling.value,
        }
    if spec.health_checks:
        checks = [check.model_dump(mode="json", exclude_defaults=True) for check in spec.health_checks]
        metadata.setdefault("annotations", {})[_HEALTH_CHECKS_ANNOTATION] = json.dumps(checks, sort_keys=True)
    if spec.spaces:
        spaces = [space.model_dump(mode="json", exclude_defaults=True) for space in spec.spaces]
        metadata.setdefault("annotations", {})[_SPACES_ANNOTATION] = json.dumps(spaces, sort_keys=True)
        body["workerGroupSpecs"] += [_space_group(spec, space) for space in spec.spaces]
    if node_addons is not None:
        nodes = spec.group_nodes()
        image = spec.image or DEFAULT_IMAGE.format(version=spec.ray_version)
        groups_by_name = {spec_mod.HEAD_GROUP: body["headGroupSpec"]}
        groups_by_name.update({group["groupName"]: group for group in body["workerGroupSpecs"]})
        for name, group in groups_by_name.items():
            if name in nodes:
                found = node_addons(nodes[name])
                pod_addons.add_to_template(
                    group["template"], found, cluster=spec.name, namespace=spec.namespace, group=name, image=image
                )
    if spec.gcs_fault_tolerance is not None:
        options: dict[str, Any] = {}
        # Without an address raypod runs the Redis (the local backend does; on Kubernetes see docs/resilience.md).
        if spec.gcs_fault_tolerance.redis_address:
            options["redisAddress"] = spec.gcs_fault_tolerance.redis_address
        if spec.gcs_fault_tolerance.external_storage_namespace:
            options["externalStorageNamespace"] = spec.gcs_fault_tolerance.external_storage_namespace
        body["gcsFaultToleranceOptions"] = options
    return {"apiVersion": API_VERSION, "kind": "RayCluster", "metadata": metadata, "spec": body}


def _space_group(spec: spec_mod.ClusterSpec, space: spec_mod.SpaceSpec) -> dict[str, Any]:
    node = spec.space_node(space)
    group = spec_mod.NodeGroupSpec(cpus=0, memory=node.memory, object_store_memory=node.object_store_memory)
    replicas = 1 if space.running else 0
    return {
        "groupName": node.name,
        "replicas": replicas,
        "minReplicas": replicas,
        "maxReplicas": 1,
        "rayStartParams": _ray_start_params(group, is_head=False),
        "template": _pod_template(spec, group, "ray-worker", head=False),
        "labels": dict(node.labels),
    }


def auth_secret_name(cluster: str) -> str:
    """The Secret (key ``auth_token``, as KubeRay reads it) holding a cluster's Ray token."""
    return f"{cluster}-raypod-ray-token"


def _ray_start_params(group: spec_mod.NodeGroupSpec, *, is_head: bool) -> dict[str, str]:
    params = {
        "num-cpus": str(group.cpus),
        "memory": str(group.memory),
        "object-store-memory": str(group.object_store_memory),
    }
    if group.gpus:
        params["num-gpus"] = str(group.gpus)
    if is_head:
        params["dashboard-host"] = "0.0.0.0"
    return params


def _pod_template(
    spec: spec_mod.ClusterSpec, group: spec_mod.NodeGroupSpec, container: str, *, head: bool
) -> dict[str, Any]:
    # Kubernetes memory must hold Ray's memory, the object store and the Ray processes themselves.
    overhead = 2 * 2**30 if head else 512 * 2**20
    limits: dict[str, str] = {
        "cpu": str(max(group.cpus, 1)),
        "memory": spec_mod.format_bytes(group.memory + group.object_store_memory + overhead),
    }
    if group.gpus:
        limits["nvidia.com/gpu"] = str(group.gpus)
    ports = (
        [
            {"containerPort": 6379, "name": "gcs-server"},
            {"containerPort": 8265, "name": "dashboard"},
            {"containerPort": 10001, "name": "client"},
        ]
        if head
        else []
    )
    main: dict[str, Any] = {
        "name": container,
        "image": spec.image or DEFAULT_IMAGE.format(version=spec.ray_version),
        "resources": {"limits": dict(limits), "requests": dict(limits)},
    }
    if spec.env:
        main["env"] = [{"name": key, "value": value} for key, value in sorted(spec.env.items())]
    if ports:
        main["ports"] = ports
    main["securityContext"] = dict(CONTAINER_SECURITY)
    # A Ray pod runs its users' code: no Kubernetes API token in it, no root, no privilege to gain.
    return {
        "spec": {"automountServiceAccountToken": False, "securityContext": dict(POD_SECURITY), "containers": [main]}
    }


# The rayproject/ray images run as user "ray" (uid 1000, group users 100); Ray writes only /tmp and its home.
POD_SECURITY: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": 1000,
    "runAsGroup": 100,
    "fsGroup": 100,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY: dict[str, Any] = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


# Fields of a RayCluster that raypod reads back. Anything else would be dropped on the way to a ClusterSpec, so
# it is refused rather than silently lost. Pod resources and ports are derived from rayStartParams.
_KNOWN = {
    "": {"apiVersion", "kind", "metadata", "spec"},
    "metadata": {"name", "namespace", "labels", "annotations"},
    "spec": {
        "rayVersion",
        "enableInTreeAutoscaling",
        "headGroupSpec",
        "workerGroupSpecs",
        "gcsFaultToleranceOptions",
        "authOptions",
        "autoscalerOptions",
    },
    "group": {
        "groupName",
        "replicas",
        "minReplicas",
        "maxReplicas",
        "rayStartParams",
        "template",
        "labels",
        "resources",
    },
    "rayStartParams": {"num-cpus", "memory", "object-store-memory", "num-gpus", "dashboard-host"},
    "template": {"spec"},
    # raypod sets these itself (POD_SECURITY, CONTAINER_SECURITY): read back, then made raypod's again.
    "podSpec": {"containers", "automountServiceAccountToken", "securityContext"},
    "container": {"name", "image", "resources", "env", "ports", "securityContext"},
}
_OWNER_ANNOTATION = "raypod.io/owner"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
KUEUE_LOCAL_QUEUE = "raypod"  # in every namespace (kueue.objects makes them)


def kueue_labels(priority: str) -> dict[str, str]:
    """What a RayCluster or RayJob carries for Kueue to queue it."""
    return {KUEUE_QUEUE_LABEL: KUEUE_LOCAL_QUEUE, KUEUE_PRIORITY_LABEL: priority}


_RUNTIME_ENV_ANNOTATION = "raypod.io/default-runtime-env"
# Hung-job detection's settings: read by raypod's agent, which KubeRay knows nothing of.
_HANGWATCH_ANNOTATION = "raypod.io/hangwatch"
_PRIORITY_ANNOTATION = "raypod.io/priority"
_SPACES_ANNOTATION = "raypod.io/spaces"  # the workspaces, whose worker groups raypod renders from them
_HEALTH_CHECKS_ANNOTATION = "raypod.io/health-checks"  # run in the Ray container by raypod (pods/exec)
_SUSPEND_ANNOTATION = "raypod.io/suspend-after-idle-s"  # raypod suspends it (deletes the RayCluster) when idle
_ANNOTATIONS = frozenset(
    {
        _OWNER_ANNOTATION,
        _RUNTIME_ENV_ANNOTATION,
        _HANGWATCH_ANNOTATION,
        _PRIORITY_ANNOTATION,
        _SPACES_ANNOTATION,
        _HEALTH_CHECKS_ANNOTATION,
        _SUSPEND_ANNOTATION,
    }
)
_MANAGED_LABELS = frozenset({"app.kubernetes.io/managed-by", *kueue_labels("normal")})


def spec_from_raycluster(manifest: Any) -> spec_mod.ClusterSpec:
    """The inverse of ``raycluster``: read a (possibly hand-edited) ``RayCluster`` back into a ClusterSpec.

    Raises:
        InvalidSpec: not a RayCluster, a field raypod does not manage, or an invalid resulting spec; the message
            names the field.
    """
    doc = _mapping(copy.deepcopy(manifest), "")
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") != "RayCluster":
        raise errors.InvalidSpec(f"expected apiVersion {API_VERSION} and kind RayCluster")
    metadata = _mapping(doc.get("metadata"), "metadata")
    body = _mapping(doc.get("spec"), "spec")
    annotations = _mapping(metadata.get("annotations", {}), "metadata.annotations")
    head = _mapping(body.get("headGroupSpec"), "spec.headGroupSpec")
    head_container = _container(head, "spec.headGroupSpec")
    ray_version = body.get("rayVersion", spec_mod.DEFAULT_RAY_VERSION)
    image = head_container.get("image")
    data: dict[str, Any] = {
        "priority": annotations.get(_PRIORITY_ANNOTATION, "normal"),
        "suspend_after_idle_s": annotations.get(_SUSPEND_ANNOTATION),
        "name": metadata.get("name"),
        "namespace": metadata.get("namespace", "default"),
        "owner": annotations.get(_OWNER_ANNOTATION),
        "ray_version": ray_version,
        "image": None if image == DEFAULT_IMAGE.format(version=ray_version) else image,
        "head": _group(head, "spec.headGroupSpec"),
        "worker_groups": [],
        "env": _env(head_container.get("env", []), "spec.headGroupSpec.template.spec.containers[0].env"),
    }
    for key, known in (("labels", _MANAGED_LABELS), ("annotations", _ANNOTATIONS)):
        extra = sorted(set(_mapping(metadata.get(key, {}), f"metadata.{key}")) - known)
        if extra:
            raise errors.InvalidSpec(f"metadata.{key}.{extra[0]}: raypod does not manage this field (it would be lost)")
    for annotation, field in (
        (_RUNTIME_ENV_ANNOTATION, "runtime_env"),
        (_HANGWATCH_ANNOTATION, "hangwatch"),
        (_SPACES_ANNOTATION, "spaces"),
        (_HEALTH_CHECKS_ANNOTATION, "health_checks"),
    ):
        if annotation in annotations:
            try:
                data[field] = json.loads(annotations[annotation])
            except (TypeError, ValueError):
                raise errors.InvalidSpec(f"metadata.annotations.{annotation}: not valid JSON") from None
    spaces = {
        f"{spec_mod.SPACE_GROUP}-{space.get('name')}" for space in data.get("spaces", []) if isinstance(space, dict)
    }
    for index, item in enumerate(_list(body.get("workerGroupSpecs", []), "spec.workerGroupSpecs")):
        where = f"spec.workerGroupSpecs[{index}]"
        group = _mapping(item, where)
        if group.get("groupName") in spaces:
            continue  # rendered from the spaces annotation
        container = _container(group, where)
        env_where = f"{where}.template.spec.containers[0].env"
        if _env(container.get("env", []), env_where) != data["env"] or container.get("image", image) != image:
            raise errors.InvalidSpec(f"{env_where}: every group shares the head's image and env in raypod")
        replicas = group.get("replicas", 1)
        bounds = (group.get("minReplicas", replicas), group.get("maxReplicas", replicas))
        data["worker_groups"].append(
            {
                "name": group.get("groupName"),
                "replicas": replicas,
                # A group whose bounds equal its replicas is fixed-size, which raypod writes as no bounds.
                "min_replicas": None if bounds == (replicas, replicas) else bounds[0],
                "max_replicas": None if bounds == (replicas, replicas) else bounds[1],
                **_group(group, where),
            }
        )
    if "autoscalerOptions" in body:
        options = _mapping(body["autoscalerOptions"], "spec.autoscalerOptions")
        extra = sorted(set(options) - {"idleTimeoutSeconds", "upscalingMode"})
        if extra:
            raise errors.InvalidSpec(f"spec.autoscalerOptions.{extra[0]}: raypod does not manage this field")
        data["autoscaling"] = {
            "idle_timeout_s": options.get("idleTimeoutSeconds", 60),
            "upscaling": options.get("upscalingMode", "Default"),
        }
    if _mapping(body.get("authOptions", {"mode": "token"}), "spec.authOptions").get("mode") != "token":
        raise errors.InvalidSpec("spec.authOptions.mode: raypod's clusters always use Ray's token authentication")
    if "gcsFaultToleranceOptions" in body:
        options = _mapping(body["gcsFaultToleranceOptions"], "spec.gcsFaultToleranceOptions")
        data["gcs_fault_tolerance"] = {
            "redis_address": options.get("redisAddress"),
            "external_storage_namespace": options.get("externalStorageNamespace"),
        }
    return spec_mod.parse_spec(data)


def _group(group: dict[str, Any], where: str) -> dict[str, Any]:
    _check_keys(group, "group", where)
    params = _mapping(group.get("rayStartParams", {}), f"{where}.rayStartParams")
    _check_keys(params, "rayStartParams", f"{where}.rayStartParams")
    result: dict[str, Any] = {
        "labels": _mapping(group.get("labels", {}), f"{where}.labels"),
        "resources": _mapping(group.get("resources", {}), f"{where}.resources"),
    }
    for param, field in (
        ("num-cpus", "cpus"),
        ("memory", "memory"),
        ("object-store-memory", "object_store_memory"),
        ("num-gpus", "gpus"),
    ):
        if param in params:
            result[field] = params[param]
    return result


def _env(value: Any, where: str) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for index, item in enumerate(_list(value, where)):
        entry = _mapping(item, f"{where}[{index}]")
        if set(entry) - {"name", "value"}:
            raise errors.InvalidSpec(f"{where}[{index}]: raypod manages plain name/value variables only")
        result[str(entry.get("name"))] = entry.get("value", "")
    return result


def _container(group: dict[str, Any], where: str) -> dict[str, Any]:
    template = _mapping(group.get("template", {}), f"{where}.template")
    pod_addons.strip_from_pod(template)
    _check_keys(template, "template", f"{where}.template")
    pod = _mapping(template.get("spec", {}), f"{where}.template.spec")
    _check_keys(pod, "podSpec", f"{where}.template.spec")
    containers = _list(pod.get("containers", [{}]), f"{where}.template.spec.containers")
    if len(containers) != 1:
        raise errors.InvalidSpec(f"{where}.template.spec.containers: raypod manages exactly one Ray container")
    container = _mapping(containers[0], f"{where}.template.spec.containers[0]")
    _check_keys(container, "container", f"{where}.template.spec.containers[0]")
    return container


def _check_keys(value: dict[str, Any], kind: str, where: str) -> None:
    unknown = sorted(set(value) - _KNOWN[kind])
    if unknown:
        prefix = f"{where}." if where else ""
        raise errors.InvalidSpec(
            f"{prefix}{unknown[0]}: raypod does not manage this field (it would be lost); remove it"
        )


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise errors.InvalidSpec(f"{where or 'manifest'}: expected a mapping")
    if where in ("", "metadata", "spec"):
        _check_keys(value, where, where)
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise errors.InvalidSpec(f"{where}: expected a list")
    return value


def unknown_fields(document: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Fields of ``document`` that a CRD's ``openAPIV3Schema`` does not define: the API server would prune them
    silently, so a KubeRay too old for a spec field is found here, before anything is applied."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    if isinstance(document, dict):
        properties = schema.get("properties")
        if properties is None:
            extra = schema.get("additionalProperties")
            if isinstance(extra, dict):
                return [f for key, value in document.items() for f in unknown_fields(value, extra, f"{path}.{key}")]
            return []
        found: list[str] = []
        for key, value in document.items():
            where = f"{path}.{key}" if path else key
            if key not in properties:
                found.append(where)
            else:
                found += unknown_fields(value, properties[key], where)
        return found
    if isinstance(document, list) and isinstance(schema.get("items"), dict):
        return [
            f for index, item in enumerate(document) for f in unknown_fields(item, schema["items"], f"{path}[{index}]")
        ]
    return []


def rayjob(
    spec: spec_mod.ClusterSpec,
    name: str,
    *,
    entrypoint: str,
    runtime_env: dict[str, Any],
    max_retries: int,
    shutdown_after_finish: bool,
    metadata: dict[str, str],
    kueue: bool = False,
    node_addons: NodeAddons | None = None,
) -> dict[str, Any]:
    """The ``RayJob`` that runs one job on a cluster of its own, shaped as ``spec`` (its workspaces aside; with
    its nodes' add-ons, so hang detection follows the job): KubeRay starts the cluster, submits the entrypoint,
    retries a failed job ``backoffLimit`` times (each on a new cluster) and, with ``shutdownAfterJobFinishes``,
    deletes the cluster when the job ends."""
    cluster = raycluster(spec.model_copy(update={"spaces": []}), kueue=kueue, node_addons=node_addons)
    # Its own token, which KubeRay makes and hands to the submitter: raypod never calls this cluster itself.
    cluster["spec"]["authOptions"] = {"mode": "token"}
    body: dict[str, Any] = {
        "entrypoint": entrypoint,
        "rayClusterSpec": cluster["spec"],
        "backoffLimit": max_retries,
        "shutdownAfterJobFinishes": shutdown_after_finish,
        "submissionMode": "K8sJobMode",
    }
    if shutdown_after_finish:
        body["ttlSecondsAfterFinished"] = 0
    if runtime_env:
        body["runtimeEnvYAML"] = yaml.safe_dump(runtime_env, sort_keys=True)
    if metadata:
        body["metadata"] = dict(metadata)
    labels = {**cluster["metadata"]["labels"], "raypod.io/cluster": spec.name}
    return {
        "apiVersion": API_VERSION,
        "kind": "RayJob",
        "metadata": {"name": name, "namespace": spec.namespace, "labels": labels},
        "spec": body,
    }


SERVE_PORT = 8000  # KubeRay's serve Service targets the head and workers' container port named "serve"
APP_LABEL = "raypod.io/serve-app"


def rayservice_name(cluster: str, app: str) -> str:
    """``<cluster>-<app>``, shortened with a digest where KubeRay's derived names (``<name>-serve-svc``, its
    clusters' ``<name>-<suffix>-head-svc``) would pass 63 characters."""
    name = f"{cluster}-{app}"
    if len(name) <= 40:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{cluster[:15].rstrip('-')}-{app[:15].rstrip('-')}-{digest}"


def rayservice(
    spec: spec_mod.ClusterSpec, app: str, builder_args: dict[str, Any], *, kueue: bool = False
) -> dict[str, Any]:
    """The ``RayService`` that serves one model application (``app``) on a cluster of its own shaped as ``spec``:
    KubeRay starts the cluster, applies the Serve config (raypod's application builder with ``builder_args``),
    routes ``<name>-serve-svc`` to the ready replicas, and upgrades without downtime when the config changes."""
    cluster = raycluster(spec.model_copy(update={"spaces": []}), kueue=kueue)
    # A token of its own, which KubeRay makes and uses for the cluster's dashboard: raypod reads Serve's status
    # from the RayService, never from that dashboard.
    cluster["spec"]["authOptions"] = {"mode": "token"}
    serve_config = {
        "http_options": {"host": "0.0.0.0", "port": SERVE_PORT},
        "applications": [
            {
                "name": app,
                "route_prefix": f"/{app}",
                "import_path": "raypod.serving.deploy:build",
                "args": builder_args,
            }
        ],
    }
    labels = {**cluster["metadata"]["labels"], "raypod.io/cluster": spec.name, APP_LABEL: app}
    return {
        "apiVersion": API_VERSION,
        "kind": "RayService",
        "metadata": {"name": rayservice_name(spec.name, app), "namespace": spec.namespace, "labels": labels},
        "spec": {"serveConfigV2": yaml.safe_dump(serve_config, sort_keys=True), "rayClusterConfig": cluster["spec"]},
    }
