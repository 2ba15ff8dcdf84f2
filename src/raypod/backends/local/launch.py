"""How a local node's processes are started: the command, the environment and, when the host allows it, the
sandbox (its own mount and PID namespaces, no capabilities).

The helpers that build the sandbox run as root with a fixed environment; a node's environment reaches its command
only after the capabilities are gone (``privileged``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

import psutil

from raypod import addons, config, errors
from raypod import spec as spec_mod
from raypod.backends import privileged
from raypod.backends.local import processes
from raypod.backends.local.gcs import INCARNATION_LABEL, ray_auth_environment
from raypod.backends.local.records import ClusterRecord, NodeRecord, Records

SHARED_DIR_VARIABLE = "RAYPOD_SHARED_DIR"
NODE_PYTHON_DIR = str(Path(__file__).parent / "node_python")
# What a node's processes are told about where they run: not secrets, the node's own names and directories.
NODE_VARIABLES = (processes.CLUSTER_MARKER, processes.NODE_MARKER, SHARED_DIR_VARIABLE)

# The server's variables a node inherits: what a program needs to run as a login shell's would. Anything else
# (AWS_*, HF_TOKEN, proxies) reaches a node only through a cluster's ``env`` or the operator's
# RAYPOD_NODE_ENV_PASSTHROUGH (docs/security.md).
NODE_ENV_ALLOWED = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "LANG", "LANGUAGE", "TZ", "TMPDIR")

# Ray Train polls its workers every 2 s by default; a lost worker is noticed sooner at 1 s, for little cost.
# Ray's defaults that assume one node per machine. Every node here shares one host, so Serve's preference for
# replicas on the proxy's own node would only pile requests onto the head's replicas while the others idle.
NODE_ENV_DEFAULTS = {
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "1",
    "RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING": "0",
    "RAY_SERVE_PROXY_PREFER_LOCAL_AZ_ROUTING": "0",
}

# GCS health checks that mark a lost node DEAD in seconds instead of ~15 s (measured, see docs/resilience.md): a
# killed raylet refuses at once, so five checks 250 ms apart take ~1.3 s; a frozen one times out five times (~6 s).
# Five misses, not three: a raylet starved of CPU for a few seconds on a saturated host is not a dead one.
FAST_HEALTH_CHECKS = {
    "RAY_health_check_period_ms": "250",
    "RAY_health_check_failure_threshold": "5",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_initial_delay_ms": "1000",
}


class Launcher:
    """Builds what a node runs: ``ray start`` with its ports and labels, its environment, its sandbox."""

    def __init__(
        self,
        home: Path,
        records: Records,
        *,
        sandbox: bool,
        fast_health_checks: bool = True,
        env_passthrough: tuple[str, ...] = (),
    ) -> None:
        self.home = home
        self.records = records
        self.sandbox = sandbox
        self.fast_health_checks = fast_health_checks
        self.env_passthrough = env_passthrough
        self._inside: dict[int, tuple[int, float]] = {}

    def node(
        self, cluster_id: str, cluster: ClusterRecord, record: NodeRecord, node: spec_mod.NodeSpec, binds: list[str]
    ) -> privileged.Launch:
        """``ray start`` for ``node``, sandboxed with the host directories ``binds`` shown to it."""
        return self._sandboxed(
            cluster, self._command(cluster_id, cluster, record, node), self.environment(cluster_id, node, record), binds
        )

    def _sandboxed(
        self, cluster: ClusterRecord, command: list[str], environment: dict[str, str], binds: list[str]
    ) -> privileged.Launch:
        """Run a node in its own mount and PID namespace, without capabilities, when the host allows it: the
        node (and every job on it) sees a fresh temporary directory holding only its cluster's, an empty
        $RAYPOD_HOME, and only its own processes; without capabilities it cannot undo the mounts."""
        if not self.sandbox:
            return privileged.Launch(command, environment)
        Path(cluster.temp_dir).mkdir(parents=True, exist_ok=True)
        temp_root = os.path.realpath(tempfile.gettempdir())
        keep = installation_dirs_under(temp_root)
        setup = [
            cluster.temp_dir,
            temp_root,
            str(self.home.resolve()),
            str(len(keep)),
            *keep,
            str(len(binds)),
            *binds,
        ]
        return privileged.sandboxed(setup, environment, command, processes.markers(environment))

    def _command(
        self, cluster_id: str, cluster: ClusterRecord, record: NodeRecord, node: spec_mod.NodeSpec
    ) -> list[str]:
        labels = {**node.labels, INCARNATION_LABEL: record.incarnation}
        command = [
            ray_executable(),
            "start",
            "--block",
            "--disable-usage-stats",
            f"--node-name={node.name}",
            f"--num-cpus={node.cpus}",
            f"--num-gpus={node.gpus}",
            f"--memory={node.memory}",
            f"--object-store-memory={node.object_store_memory}",
            f"--labels={','.join(f'{k}={v}' for k, v in sorted(labels.items()))}",
            f"--dashboard-agent-listen-port={record.agent_port}",
            f"--dashboard-agent-grpc-port={record.agent_grpc_port}",
            f"--metrics-export-port={record.metrics_port}",
            f"--node-manager-port={record.node_manager_port}",
            f"--object-manager-port={record.object_manager_port}",
            f"--runtime-env-agent-port={record.runtime_env_agent_port}",
        ]
        if node.resources:
            command.append(f"--resources={json.dumps(node.resources)}")
        if node.is_head:
            command += [
                "--head",
                f"--port={cluster.gcs_port}",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={cluster.dashboard_port}",
                f"--ray-client-server-port={cluster.client_port}",
                f"--temp-dir={cluster.temp_dir}",
            ]
            if node.managed_redis:
                command.append(f"--redis-password={self.records.redis_password(cluster_id)}")
        else:
            # Its log monitor then reads only its own node's logs.
            command += [f"--address=127.0.0.1:{cluster.gcs_port}", f"--temp-dir={record.temp_dir}"]
        return command

    def environment(self, cluster_id: str, node: spec_mod.NodeSpec, record: NodeRecord) -> dict[str, str]:
        """From an allow-list of the server's variables (``node_environment``), never the server's whole
        environment (its cloud keys, its hub tokens); then raypod's, the spec's ``env``, and the node's own."""
        env = node_environment(os.environ, self.env_passthrough)
        # `python` in a job's entrypoint is the interpreter Ray runs on (as in a Ray image), even when raypod was
        # started from a virtual environment that is not activated.
        interpreter_bin = str(Path(sys.executable).parent)
        env["PATH"] = os.pathsep.join([interpreter_bin, *(p for p in env.get("PATH", "").split(os.pathsep) if p)])
        # Every Python process of the node starts with raypod's sitecustomize (it defers a slow import of Ray's).
        env["PYTHONPATH"] = os.pathsep.join(
            [NODE_PYTHON_DIR, *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
        )
        env.update(node.env)
        env.update(ray_auth_environment(self.records.ray_token(cluster_id)))
        if self.fast_health_checks and node.is_head:
            env.update(FAST_HEALTH_CHECKS)
        for key, value in NODE_ENV_DEFAULTS.items():
            env.setdefault(key, value)  # after node.env: a spec's own setting wins
        if node.is_head:
            env.update(config.MonitoringEndpoints.read(self.home).ray_dashboard_env())
        cluster = self.records.read_cluster(cluster_id)
        if cluster is not None:
            # One host, one filesystem: a directory every node of the cluster sees (a sandboxed node's /tmp is
            # its own), for what Ray needs shared, such as Ray Train's storage_path.
            env[SHARED_DIR_VARIABLE] = os.path.join(cluster.temp_dir, "shared")
            if node.managed_redis and cluster.redis_port:
                env["RAY_REDIS_ADDRESS"] = f"127.0.0.1:{cluster.redis_port}"
        fill = addons.Filled(
            addon_dir=record.addon_dir, gcs=f"127.0.0.1:{cluster.gcs_port}" if cluster else "", node=record.name
        )
        env.update({name: fill(value) for name, value in node.addons.env})
        for name, item in node.addons.env_lists:
            present = [entry for entry in env.get(name, "").split(",") if entry.strip()]
            env[name] = ",".join([*present, fill(item)])
        env[processes.CLUSTER_MARKER] = cluster_id
        env[processes.NODE_MARKER] = node.name
        env["RAY_NODE_TYPE_NAME"] = node.group  # becomes Ray's ray.io/node-group label, as on KubeRay
        return env

    def as_node(self, record: NodeRecord, environment: dict[str, str], argv: list[str]) -> privileged.Launch:
        """``argv`` run as the node runs, with ``environment``: inside its mount and PID namespaces, without
        capabilities, when nodes are sandboxed (it sees the node's files and process ids, and can do no more than
        the node; the helpers that enter the namespaces never see ``environment``).

        Raises:
            NotYet: the node is still starting. NotFound: it is not running.
        """
        if not self.sandbox:
            return privileged.Launch(argv, environment)
        return privileged.in_namespaces_of(self._inside_pid(record), environment, argv, processes.markers(environment))

    def running_environment(self, record: NodeRecord) -> dict[str, str]:
        """The environment the node's command started with (read back from the process: what the node's spec and
        raypod gave it). Raises psutil.Error when it is not running."""
        environment = dict(psutil.Process(self._inside_pid(record) if self.sandbox else record.pid).environ())
        if "RAY_AUTH_TOKEN" not in environment:
            raise errors.NotYet(f"node {record.name} is still starting")  # the sandbox's helpers run
        return environment

    def _inside_pid(self, record: NodeRecord) -> int:
        """A process inside a sandboxed node's namespaces: the first child of its ``unshare`` (found once; a
        process listing costs a scan of every process on the host)."""
        cached = self._inside.get(record.pid)
        if cached is not None and psutil.pid_exists(cached[0]) and cached[1] == record.create_time:
            return cached[0]
        try:
            children = psutil.Process(record.pid).children()
        except psutil.NoSuchProcess as exc:
            raise errors.NotFound(f"node {record.name} is not running") from exc
        if not children:
            raise errors.NotYet(f"node {record.name} is still starting")
        self._inside[record.pid] = (children[0].pid, record.create_time)
        return children[0].pid

    def hidden_from_nodes(self, cluster_id: str, path: str) -> str | None:
        """What a sandboxed node sees of this host is what ``_sandboxed`` leaves: the temporary root holds only its
        cluster's directory and the Python installation, and raypod's home is empty."""
        if not self.sandbox:
            return None
        real = os.path.realpath(path)

        def under(root: str) -> bool:
            return real == root or real.startswith(root.rstrip("/") + "/")

        if under(os.path.realpath(self.home)):
            return "raypod's home is hidden from the nodes"
        temp_root = os.path.realpath(tempfile.gettempdir())
        cluster = self.records.read_cluster(cluster_id)
        visible = [*installation_dirs_under(temp_root), *([os.path.realpath(cluster.temp_dir)] if cluster else [])]
        if under(temp_root) and not any(under(kept) for kept in visible):
            return f"sandboxed nodes have a {temp_root} of their own"
        return None


def node_environment(server: Mapping[str, str], passthrough: Iterable[str] = ()) -> dict[str, str]:
    allowed = {*NODE_ENV_ALLOWED, *passthrough}
    return {
        name: value
        for name, value in server.items()
        if (name in allowed or name.startswith("LC_")) and not name.startswith(("RAYPOD_", "RAY_"))
    }


def ray_executable() -> str:
    beside_python = Path(sys.executable).parent / "ray"
    if beside_python.exists():
        return str(beside_python)
    found = shutil.which("ray")
    if not found:
        raise errors.PermanentError("the 'ray' command is not installed: pip install 'ray[default]'")
    return found


def installation_dirs_under(root: str) -> list[str]:
    """The directories of this Python installation and of raypod that lie under ``root`` (a checkout and its
    virtual environment in /tmp, say): a sandboxed node must still see the interpreter it runs on."""
    import raypod

    found = {
        os.path.realpath(path)
        for path in (sys.prefix, sys.base_prefix, os.path.dirname(sys.executable), Path(raypod.__file__).parents[1])
    }
    inside = sorted(path for path in found if path.startswith(root.rstrip("/") + "/"))
    return [path for path in inside if not any(path.startswith(other + "/") for other in inside if other != path)]


def sandbox_available() -> tuple[bool, str]:
    """Whether nodes can run in their own mount and PID namespaces here (root, util-linux, namespaces allowed)."""
    if os.geteuid() != 0:
        return False, "the server does not run as root"
    if not (privileged.available("unshare", "setpriv", "nsenter", "mount") and Path("/run").is_dir()):
        return False, "util-linux's unshare, nsenter, setpriv and mount are not installed"
    mount, setpriv = privileged.helper("mount"), privileged.helper("setpriv")
    probe = subprocess.run(
        [
            privileged.helper("unshare"),
            *privileged.UNSHARE_FLAGS,
            "--",
            "/bin/sh",
            "-c",
            f"{mount} -t tmpfs tmpfs /run && {setpriv} --bounding-set=-all -- true",
        ],
        env=privileged.FIXED_ENVIRONMENT,
        capture_output=True,
        timeout=10,
        check=False,
    )
    if probe.returncode != 0:
        return False, f"this host does not allow mount and PID namespaces ({probe.stderr.decode()[:120].strip()})"
    return True, ""
