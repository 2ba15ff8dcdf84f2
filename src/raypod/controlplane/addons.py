"""Which add-ons each node gets: the capabilities' words for what runs beside Ray on a node, attached by the
planner to the nodes it creates (backends translate them and know no capability)."""

from __future__ import annotations

from pathlib import Path

from raypod import addons, config
from raypod import spec as spec_mod
from raypod.capabilities.hangwatch import addons as hangwatch_addons
from raypod.capabilities.spaces import ide


class NodeAddonMaker:
    """Called with each node the planner creates; ``home`` is the server's (workspaces keep their files there)."""

    def __init__(self, home: Path) -> None:
        self.home = home

    def __call__(self, node: spec_mod.NodeSpec) -> addons.NodeAddons:
        found = addons.NONE
        if node.hangwatch is not None:
            found += hangwatch_addons.for_node(node.hangwatch)
        if node.space is not None:
            namespace, name = node.space_path.strip("/").split("/")[1:3]
            files = ide.files_dir(self.home, namespace, name, node.space.owner)
            where = config.read_credentials()  # the server's address and CA; its token is not for the node
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
