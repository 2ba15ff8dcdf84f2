"""Node add-ons on local nodes: their files in the node's add-on directory, their sidecars as processes run as
the node runs (inside its sandbox, with its environment), each with a port of its own."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import httpx
import psutil

from raypod import addons, errors, state, untrusted_files
from raypod.backends.local import processes
from raypod.backends.local.launch import Launcher
from raypod.backends.local.records import ClusterRecord, NodeRecord, Records


class Sidecars:
    def __init__(self, records: Records, children: processes.Children, launcher: Launcher) -> None:
        self.records = records
        self.children = children
        self.launcher = launcher
        self._answered: dict[tuple[str, str, str], int] = {}  # (cluster, node, sidecar) -> the pid that answered
        self._http = httpx.Client(timeout=httpx.Timeout(1.0))

    def place(self, cluster: ClusterRecord, record: NodeRecord, found: addons.NodeAddons, taken: set[int]) -> list[str]:
        """Write the add-ons' files into the node's add-on directory (new with each incarnation), keep its
        sidecars in its record with a port each, and return the host directories its sandbox must show."""
        if not found:
            return []
        record.addon_dir = os.path.join(cluster.temp_dir, "addons", f"{record.name}-{record.incarnation[:8]}")
        for relative, content in found.files:
            # The cluster's directory is its nodes' to change: written without following their links.
            untrusted_files.write_bytes(
                resolved_parent(cluster.temp_dir),
                os.path.relpath(os.path.join(record.addon_dir, relative), cluster.temp_dir),
                content,
                mode=0o644,
            )
        for bind in found.binds:
            Path(bind).mkdir(parents=True, exist_ok=True)
        record.sidecars = [addons.sidecar_to_json(sidecar) for sidecar in found.sidecars]
        ports = self.records.allocate_ports(len(found.sidecars), taken) if found.sidecars else []
        record.sidecar_ports = {sidecar.name: port for sidecar, port in zip(found.sidecars, ports, strict=True)}
        return list(found.binds)

    def start(self, cluster_id: str, cluster: ClusterRecord, record: NodeRecord, sidecar: str) -> None:
        wanted = next((addons.sidecar_from_json(s) for s in record.sidecars if s.get("name") == sidecar), None)
        if wanted is None:
            raise errors.PermanentError(f"node {record.name} has no sidecar {sidecar}")
        if states(record).get(sidecar) is state.SidecarState.RUNNING:
            return
        fill = addons.Filled(
            addon_dir=record.addon_dir,
            gcs=f"127.0.0.1:{cluster.gcs_port}",
            port=record.sidecar_ports.get(sidecar, 0),
            token=self.records.sidecar_token(cluster_id, record.name, sidecar),
            node=record.name,
        )
        try:
            own = {k: fill(v) for k, v in (*wanted.env, *wanted.secret_env)}
            environment = {**self.launcher.running_environment(record), **own}
            launch = self.launcher.as_node(record, environment, [fill(arg) for arg in wanted.argv])
        except errors.NotYet:
            raise  # its sidecars start beside its start: the next pass asks again once Ray's command runs
        except (psutil.Error, errors.RaypodError) as exc:
            raise errors.TransientError(f"node {record.name} is starting or stopping: {exc}") from exc
        log_path = self.records.log_path(cluster_id, f"{record.name}.{sidecar}")
        pid = self.children.spawn(launch, cwd=fill(wanted.cwd), log_path=log_path)
        record.sidecar_processes[sidecar] = [pid, processes.create_time(pid)]
        self.records.write_node(cluster_id, record)

    def endpoints(self, cluster_id: str, records: dict[str, NodeRecord]) -> dict[str, str]:
        """The endpoints the nodes' sidecars publish, once they answer."""
        return {
            sidecar.endpoint: f"http://127.0.0.1:{record.sidecar_ports[sidecar.name]}"
            for record in records.values()
            for sidecar in map(addons.sidecar_from_json, record.sidecars)
            if sidecar.endpoint and self._answers(cluster_id, record, sidecar)
        }

    def _answers(self, cluster_id: str, record: NodeRecord, sidecar: addons.Sidecar) -> bool:
        """Whether the sidecar runs and has answered its probe once (an IDE takes seconds to listen)."""
        pid, create_time = record.sidecar_processes.get(sidecar.name, [0, 0.0])
        if not (pid and processes.process_matches(int(pid), create_time)):
            return False
        key = (cluster_id, record.name, sidecar.name)
        if self._answered.get(key) == pid:
            return True
        if sidecar.ready is None:
            return True
        token = self.records.sidecar_token(cluster_id, record.name, sidecar.name)
        headers = {name: value.replace("{token}", token) for name, value in sidecar.ready.headers}
        try:
            response = self._http.get(
                f"http://127.0.0.1:{record.sidecar_ports[sidecar.name]}{sidecar.ready.path}", headers=headers
            )
        except httpx.HTTPError:
            return False
        if response.status_code != 200:
            return False
        self._answered[key] = int(pid)
        return True

    def close(self) -> None:
        self._http.close()


def states(record: NodeRecord) -> dict[str, state.SidecarState]:
    """What runs of the node's sidecars (read from its record and the process table: nothing is started here)."""
    found = {}
    for sidecar in record.sidecars:
        name = str(sidecar.get("name"))
        pid, create_time = record.sidecar_processes.get(name, [0, 0.0])
        if not pid:
            found[name] = state.SidecarState.NOT_STARTED
        elif processes.process_matches(int(pid), create_time):
            found[name] = state.SidecarState.RUNNING
        else:
            found[name] = state.SidecarState.EXITED
    return found


def resolved_parent(path: str) -> Path:
    """``path`` with the temporary root that holds every cluster's directory resolved (raypod's; a node cannot
    change it), the rest as written: a link a node put below stays a link, for ``hangwatch.layout`` to refuse."""
    relative = os.path.relpath(path, tempfile.gettempdir())
    if relative.startswith(".."):
        return Path(path)
    return Path(os.path.realpath(tempfile.gettempdir()), relative)
