"""Node add-ons: what a capability asks a backend to put on a node beyond Ray itself, in words every backend can
translate, so that no backend knows a capability. Hang detection adds its agent and a configuration file; a
workspace adds its IDE and the folder of its files. The local backend writes the files into the node's add-on
directory, adds the environment to the node's, lets its sandbox see the binds, and keeps the sidecars running
beside the node in its isolation; a Kubernetes backend would render volumes, environment and containers of the
node's pod.

Values of ``argv``, ``cwd`` and environment may hold placeholders the backend fills: ``{addon_dir}`` (the node's
add-on directory as the node sees it), ``{port}`` (a port the backend reserved for the sidecar), ``{gcs}`` (the
cluster's GCS address), ``{token}`` (the sidecar's secret, kept by the backend, 0600, presented by the gateway
and the readiness probe; never in a spec or an event), ``{python}`` (the Python with raypod installed: the server's
own on the local backend, the image's ``python`` in a pod), ``{host}`` (the address a sidecar listens on: loopback
on the local backend, where the gateway is on the same host; every address in a pod, reached through its Service)
and ``{node}`` (the node's name as the backend knows it: raypod's on the local backend, the pod's on Kubernetes).

A leaf module of the vocabulary: it imports nothing of raypod.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Probe:
    """An HTTP GET on the sidecar's loopback port; a 200 means it serves."""

    path: str
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Sidecar:
    """A process kept running beside a node, in the node's isolation, with the node's environment and ``env``."""

    name: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    cwd: str = "/"
    ready: Probe | None = None
    endpoint: str = ""  # the cluster endpoint it is published as once ``ready`` answers (``space/<name>``)
    # Variables whose values are secrets (a credential to report to the control plane): never in a manifest (a
    # Secret on Kubernetes); the local backend gives them to the process alone.
    secret_env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class NodeAddons:
    env: tuple[tuple[str, str], ...] = ()
    # Comma-separated lists in the node's environment that get these items appended (RAY_TRAIN_CALLBACKS).
    env_lists: tuple[tuple[str, str], ...] = ()
    files: tuple[tuple[str, bytes], ...] = ()  # relative to the add-on directory, written before the node starts
    binds: tuple[str, ...] = ()  # host directories the node sees and may write (a workspace's files)
    sidecars: tuple[Sidecar, ...] = ()

    def __add__(self, other: NodeAddons) -> NodeAddons:
        return NodeAddons(
            env=self.env + other.env,
            env_lists=self.env_lists + other.env_lists,
            files=self.files + other.files,
            binds=self.binds + other.binds,
            sidecars=self.sidecars + other.sidecars,
        )

    def __bool__(self) -> bool:
        return bool(self.env or self.env_lists or self.files or self.binds or self.sidecars)


NONE = NodeAddons()


@dataclass(frozen=True)
class Filled:
    """The values a backend substitutes for one node (and one sidecar)."""

    addon_dir: str
    gcs: str = ""
    port: int = 0
    token: str = ""
    python: str = sys.executable
    host: str = "127.0.0.1"
    node: str = ""

    def __call__(self, value: str) -> str:
        return (
            value.replace("{addon_dir}", self.addon_dir)
            .replace("{port}", str(self.port))
            .replace("{gcs}", self.gcs)
            .replace("{token}", self.token)
            .replace("{python}", self.python)
            .replace("{host}", self.host)
            .replace("{node}", self.node)
        )


def sidecar_to_json(sidecar: Sidecar) -> dict[str, Any]:
    return asdict(sidecar)


def sidecar_from_json(data: dict[str, Any]) -> Sidecar:
    """A sidecar a backend kept in its own records (written by ``sidecar_to_json``)."""
    ready = data.get("ready")
    return Sidecar(
        name=str(data["name"]),
        argv=tuple(data["argv"]),
        env=tuple((str(k), str(v)) for k, v in data.get("env", ())),
        cwd=str(data.get("cwd", "/")),
        ready=Probe(ready["path"], tuple((str(k), str(v)) for k, v in ready.get("headers", ()))) if ready else None,
        endpoint=str(data.get("endpoint", "")),
        secret_env=tuple((str(k), str(v)) for k, v in data.get("secret_env", ())),
    )
