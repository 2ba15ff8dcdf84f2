"""Which add-ons each node gets: the capabilities' words for what runs beside Ray on a node, attached by the
planner to the nodes it creates (backends translate them and know no capability)."""

from __future__ import annotations

from pathlib import Path

from raypod import addons, config
from raypod import spec as spec_mod
from raypod.capabilities.hangwatch import addons as hangwatch_addons
from raypod.capabilities.spaces import ide
from raypod.controlplane.hangwatch import AgentReports


class NodeAddonMaker:
    """Called with each node the planner creates; ``home`` is the server's (workspaces keep their files there);
    ``reports``: where agents report over HTTP, for a backend whose nodes share no directory with the server."""

    def __init__(
        self, home: Path, reports: AgentReports | None = None, server: str = "", ca: bytes | None = None
    ) -> None:
        self.home = home
        self.reports = reports
        self.server = server  # where nodes reach the server (Settings.node_url)
        self.ca = ca

    def __call__(self, cluster_id: str, node: spec_mod.NodeSpec) -> addons.NodeAddons:
        found = addons.NONE
        where = config.read_credentials()  # the server's address and CA; its token is not for the node
        if node.hangwatch is not None:
            report = None
            if self.reports is not None and self.server:
                report = hangwatch_addons.Report(self.server, self.reports.token(cluster_id), self.ca)
            found += hangwatch_addons.for_node(node.hangwatch, report)
        if node.space is not None:
            namespace, name = node.space_path.strip("/").split("/")[1:3]
            files = ide.files_dir(self.home, namespace, name, node.space.owner)
            found += ide.addons(node.space, node.space_path, files, where.get("server"), _read(where.get("ca_file")))
        return found


def _read(path: str | None) -> bytes | None:
    """raypod's CA certificate (public), when there is one to give the workspace's SDK."""
    if not path:
        return None
    try:
        return Path(path).read_bytes()
    except OSError:
        return None
