"""The embedded default backend: every Ray node is a real ``ray start --block`` process tree on this host.

What the backend started is described by small JSON records under ``<home>/local/<cluster id>/`` (``records``) and
by environment markers that every process of a node inherits (``processes``), so a restarted control plane
observes (adopts) running nodes without remembering anything, and deleting a node finds every process it started.
``launch`` builds a node's command, environment and sandbox; ``gcs`` asks each cluster's GCS; ``redis`` runs the
Redis servers beside a cluster; ``sidecars`` places node add-ons.
"""

from raypod.backends.local.backend import LocalBackend
from raypod.backends.local.gcs import ray_auth_environment
from raypod.backends.local.launch import FAST_HEALTH_CHECKS, NODE_PYTHON_DIR, NODE_VARIABLES, node_environment
from raypod.backends.local.processes import CLUSTER_MARKER, NODE_MARKER
from raypod.backends.local.records import NODE_PORTS
from raypod.backends.local.redis import redis_server_binary

__all__ = [
    "CLUSTER_MARKER",
    "FAST_HEALTH_CHECKS",
    "NODE_MARKER",
    "NODE_PORTS",
    "NODE_PYTHON_DIR",
    "NODE_VARIABLES",
    "LocalBackend",
    "node_environment",
    "ray_auth_environment",
    "redis_server_binary",
]
