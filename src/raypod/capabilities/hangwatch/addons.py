"""What hang detection adds to a node: its agent as a sidecar, the cluster's settings beside it, and the variables
that make Ray Train's ranks report to it."""

from __future__ import annotations

import json

from raypod import addons
from raypod import spec as spec_mod
from raypod.capabilities.hangwatch import layout

DIR = "{addon_dir}/hangwatch"  # the node's hangwatch directory (layout.py), under its add-on directory
SUBDIR = "hangwatch"


def for_node(settings: spec_mod.HangwatchSpec) -> addons.NodeAddons:
    # The agent sees the node's process ids and may ptrace them for stacks: it runs in the node's isolation.
    agent = addons.Sidecar(spec_mod.HANGWATCH_SIDECAR, ("{python}", "-m", "raypod.capabilities.hangwatch.agent", DIR))
    return addons.NodeAddons(
        env=((layout.DIR_VARIABLE, DIR),),
        env_lists=((layout.CALLBACKS_VARIABLE, layout.CALLBACK),),
        files=((f"{SUBDIR}/config.json", json.dumps(settings.model_dump(mode="json")).encode()),),
        sidecars=(agent,),
    )
