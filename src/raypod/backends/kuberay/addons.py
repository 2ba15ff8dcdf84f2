"""Node add-ons as parts of a KubeRay pod template (pure): what a capability adds to a node, in the words of
``raypod.addons``, becomes Kubernetes objects a pod already knows how to run.

- ``files`` -> one ConfigMap per cluster, copied by an init container into the add-on directory, an emptyDir at
  ``ADDON_DIR`` that the Ray container and the sidecars share (the hangwatch agent writes its state there).
- ``env`` -> variables of the Ray container (and the sidecars); ``env_lists`` are appended to the spec's value.
- ``sidecars`` -> containers of the pod, in its process namespace (the hangwatch agent reads and signals the Ray
  processes), with Ray's log directory shared; a sidecar with an ``endpoint`` listens on every address at a fixed
  port behind a Service of its own (``service_name``), and its ``{token}`` comes from the cluster's sidecar Secret.
- ``binds`` -> PersistentVolumeClaims (``claim_name``) mounted at the same path: a workspace's files outlive its pod.

The pod template's annotation ``ANNOTATION`` lists what was added, so that a manifest read back
(``manifests.spec_from_raycluster``) loses exactly that and nothing of the user's.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from raypod import addons

ADDON_DIR = "/raypod/addons"
FILES_MOUNT = "/raypod/addon-files"
RAY_TMP = "/tmp/ray"  # Ray's session and log directory: the hangwatch agent reads the ranks' logs there
SIDECAR_PORT = 8800  # the first sidecar's port; the next ones count up
TOKEN_VARIABLE = "RAYPOD_SIDECAR_TOKEN"
POD_NAME_VARIABLE = "RAYPOD_POD_NAME"  # the downward API's pod name: ``{node}`` in a pod
ANNOTATION = "raypod.io/addons"
PREFIX = "raypod-"  # containers and volumes raypod adds to a pod carry it
_ADDON_VOLUME, _FILES_VOLUME, _TMP_VOLUME = f"{PREFIX}addons", f"{PREFIX}addon-files", f"{PREFIX}ray-tmp"


def files_configmap(cluster: str) -> str:
    return f"{cluster}-raypod-addons"


def sidecar_secret(cluster: str) -> str:
    return f"{cluster}-raypod-sidecars"


def claim_name(path: str) -> str:
    """The PersistentVolumeClaim of a bound directory: by the directory, not by cluster, so a workspace's files
    outlive the cluster and follow a move, as on the local backend."""
    return f"raypod-files-{hashlib.sha256(path.encode()).hexdigest()[:16]}"


def service_name(cluster: str, endpoint: str) -> str:
    """``<cluster>-<endpoint>`` (``demo-space-nb``), a DNS label, shortened with a digest when too long."""
    name = f"{cluster}-{endpoint.replace('/', '-')}".lower()
    if len(name) <= 63:
        return name
    return f"{name[:50].rstrip('-')}-{hashlib.sha256(name.encode()).hexdigest()[:12]}"


def token_key(group: str, sidecar: str) -> str:
    """A sidecar's key in the cluster's sidecar Secret."""
    return f"{group}.{sidecar}"


def secret_key(group: str, sidecar: str, variable: str) -> str:
    """A sidecar's secret variable's key in the cluster's sidecar Secret."""
    return f"{group}.{sidecar}.{variable}"


def file_key(group: str, path: str) -> str:
    """A file's key in the cluster's add-on ConfigMap (keys are ``[-._a-zA-Z0-9]+``)."""
    return f"{group}.{hashlib.sha256(path.encode()).hexdigest()[:16]}"


@dataclass(frozen=True)
class Port:
    sidecar: str
    endpoint: str
    port: int


def sidecar_ports(found: addons.NodeAddons) -> list[Port]:
    return [
        Port(sidecar.name, sidecar.endpoint, SIDECAR_PORT + index)
        for index, sidecar in enumerate(found.sidecars)
        if sidecar.endpoint
    ]


def uses_token(found: addons.NodeAddons) -> list[str]:
    """The sidecars whose arguments, environment or probe use their ``{token}``."""
    names = []
    for sidecar in found.sidecars:
        values = [*sidecar.argv, *(v for _, v in sidecar.env), sidecar.cwd]
        if sidecar.ready is not None:
            values += [v for _, v in sidecar.ready.headers]
        if any("{token}" in value for value in values):
            names.append(sidecar.name)
    return names


def add_to_template(
    template: dict[str, Any], found: addons.NodeAddons, *, cluster: str, namespace: str, group: str, image: str
) -> None:
    """Add ``found`` to a pod template, in place; its Ray container is the first."""
    if not found:
        return
    pod = template["spec"]
    ray = pod["containers"][0]
    added: dict[str, list[str]] = {"env": [], "volumes": [], "containers": [], "init": []}
    replaced: dict[str, str] = {}
    env = {item["name"]: item for item in ray.get("env", [])}
    for name, value in found.env:
        if name in env:
            replaced[name] = env[name].get("value", "")
        env[name] = {"name": name, "value": _fill(value, cluster, namespace, 0)}
        added["env"].append(name)
    for name, item in found.env_lists:
        current = env.get(name, {}).get("value", "")
        if name in env and name not in replaced:
            replaced[name] = current
        env[name] = {"name": name, "value": f"{current},{item}" if current else item}
        added["env"].append(name)
    ray["env"] = [env[name] for name in sorted(env)]
    volumes = pod.setdefault("volumes", [])
    mounts = [{"name": _ADDON_VOLUME, "mountPath": ADDON_DIR}, {"name": _TMP_VOLUME, "mountPath": RAY_TMP}]
    volumes += [{"name": _ADDON_VOLUME, "emptyDir": {}}, {"name": _TMP_VOLUME, "emptyDir": {}}]
    added["volumes"] += [_ADDON_VOLUME, _TMP_VOLUME]
    for index, path in enumerate(found.binds):
        volume = f"{PREFIX}bind-{index}"
        volumes.append({"name": volume, "persistentVolumeClaim": {"claimName": claim_name(path)}})
        mounts.append({"name": volume, "mountPath": path})
        added["volumes"].append(volume)
    ray["volumeMounts"] = [*ray.get("volumeMounts", []), *mounts]
    if found.files:
        volumes.append({"name": _FILES_VOLUME, "configMap": {"name": files_configmap(cluster), "items": []}})
        volumes[-1]["configMap"]["items"] = [
            {"key": file_key(group, path), "path": path} for path, _ in sorted(found.files)
        ]
        added["volumes"].append(_FILES_VOLUME)
        copy: dict[str, Any] = {
            "name": f"{PREFIX}addon-files",
            "image": image,
            # The ConfigMap's files, made writable beside what the sidecars write (a volume of its own is not).
            "command": ["sh", "-c", f"cp -RL {FILES_MOUNT}/. {ADDON_DIR}/"],
            "volumeMounts": [
                {"name": _FILES_VOLUME, "mountPath": FILES_MOUNT, "readOnly": True},
                {"name": _ADDON_VOLUME, "mountPath": ADDON_DIR},
            ],
            "securityContext": dict(ray.get("securityContext", {})),
        }
        pod["initContainers"] = [*pod.get("initContainers", []), copy]
        added["init"].append(copy["name"])
    with_token = set(uses_token(found))
    ports = {port.sidecar: port.port for port in sidecar_ports(found)}
    for index, sidecar in enumerate(found.sidecars):
        port = ports.get(sidecar.name, SIDECAR_PORT + index)
        container: dict[str, Any] = {
            "name": f"{PREFIX}{sidecar.name}",
            "image": image,
            "command": [_fill(arg, cluster, namespace, port) for arg in sidecar.argv],
            "workingDir": _fill(sidecar.cwd, cluster, namespace, port),
            "volumeMounts": [dict(m) for m in mounts],
            "securityContext": dict(ray.get("securityContext", {})),
        }
        sidecar_env: list[dict[str, Any]] = [
            {"name": name, "value": _fill(value, cluster, namespace, port)} for name, value in sidecar.env
        ]
        for variable, _ in sidecar.secret_env:
            secret = {"name": sidecar_secret(cluster), "key": secret_key(group, sidecar.name, variable)}
            sidecar_env.append({"name": variable, "valueFrom": {"secretKeyRef": secret}})
        if sidecar.name in with_token:
            secret = {"name": sidecar_secret(cluster), "key": token_key(group, sidecar.name)}
            sidecar_env.insert(0, {"name": TOKEN_VARIABLE, "valueFrom": {"secretKeyRef": secret}})
        pod_name = {"name": POD_NAME_VARIABLE, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
        container["env"] = [pod_name, *ray["env"], *sidecar_env]
        if sidecar.name in ports:
            container["ports"] = [{"containerPort": port, "name": f"{PREFIX}{index}"}]
            if sidecar.ready is not None:
                container["readinessProbe"] = {"tcpSocket": {"port": port}, "periodSeconds": 2}
        pod["containers"].append(container)
        added["containers"].append(container["name"])
    if found.sidecars:
        pod["shareProcessNamespace"] = True  # the agent follows the Ray processes by pid
    annotation = {**added, "replaced_env": replaced}
    template.setdefault("metadata", {}).setdefault("annotations", {})[ANNOTATION] = json.dumps(
        annotation, sort_keys=True
    )


def _fill(value: str, cluster: str, namespace: str, port: int) -> str:
    """Placeholders as a pod sees them; the token is Kubernetes' ``$(VAR)`` expansion of the Secret's value."""
    return addons.Filled(
        addon_dir=ADDON_DIR,
        gcs=f"{cluster}-head-svc.{namespace}.svc:6379",
        port=port,
        token=f"$({TOKEN_VARIABLE})",
        python="python",
        host="0.0.0.0",
        node=f"$({POD_NAME_VARIABLE})",
    )(value)


def strip_from_pod(template: dict[str, Any]) -> None:
    """Undo ``add_to_pod`` on a pod template read back (in place): what its annotation says raypod added goes."""
    metadata = template.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    raw = annotations.pop(ANNOTATION, None)
    if not annotations:
        metadata.pop("annotations", None)
    if not metadata:
        template.pop("metadata", None)
    if raw is None:
        return
    try:
        added = json.loads(raw)
    except ValueError:
        return
    pod = template.get("spec") or {}
    containers = set(added.get("containers", []))
    pod["containers"] = [c for c in pod.get("containers", []) if c.get("name") not in containers]
    volumes = set(added.get("volumes", []))
    _drop(pod, "volumes", lambda item: item.get("name") in volumes)
    init = set(added.get("init", []))
    _drop(pod, "initContainers", lambda item: item.get("name") in init)
    pod.pop("shareProcessNamespace", None)
    if pod.get("containers"):
        ray = pod["containers"][0]
        _drop(ray, "volumeMounts", lambda item: item.get("name") in volumes)
        replaced = added.get("replaced_env", {})
        names = set(added.get("env", []))
        env = []
        for item in ray.get("env", []):
            if item.get("name") in replaced:
                env.append({"name": item["name"], "value": replaced[item["name"]]})
            elif item.get("name") not in names:
                env.append(item)
        ray["env"] = env
        if not env:
            ray.pop("env")


def _drop(holder: dict[str, Any], key: str, gone: Any) -> None:
    kept = [item for item in holder.get(key, []) if not gone(item)]
    if kept:
        holder[key] = kept
    else:
        holder.pop(key, None)


def objects_wanted(per_group: Iterable[tuple[str, addons.NodeAddons]]) -> dict[str, Any]:
    """The ConfigMap data (files), the Secret's keys (sidecar tokens to make, secret variables as given) the
    groups' add-ons need, and the bound paths."""
    files: dict[str, bytes] = {}
    tokens: list[str] = []
    secrets: dict[str, str] = {}
    binds: list[str] = []
    for group, found in per_group:
        files.update({file_key(group, path): data for path, data in found.files})
        tokens += [token_key(group, name) for name in uses_token(found)]
        for sidecar in found.sidecars:
            secrets.update({secret_key(group, sidecar.name, name): value for name, value in sidecar.secret_env})
        binds += list(found.binds)
    return {"files": files, "tokens": tokens, "secrets": secrets, "binds": binds}
