"""What hang detection adds to a node: its agent as a sidecar, the cluster's settings beside it, and the variables
that make Ray Train's ranks report to it."""

from __future__ import annotations

import json
from dataclasses import dataclass

from raypod import addons
from raypod import spec as spec_mod
from raypod.capabilities.hangwatch import layout

DIR = "{addon_dir}/hangwatch"  # the node's hangwatch directory (layout.py), under its add-on directory
SUBDIR = "hangwatch"


REPORT_URL_VARIABLE = "RAYPOD_HANGWATCH_REPORT_URL"
REPORT_TOKEN_VARIABLE = "RAYPOD_HANGWATCH_REPORT_TOKEN"
REPORT_CA_VARIABLE = "RAYPOD_HANGWATCH_REPORT_CA"
AGENTS_ROUTE = "/api/v1/hangwatch/agents"


@dataclass(frozen=True)
class Report:
    """Where an agent sends what it writes when the server cannot read its directory (pods): the server's address,
    its cluster's agent credential, and raypod's CA where the server's certificate is raypod's own."""

    server: str
    token: str
    ca: bytes | None = None


def for_node(settings: spec_mod.HangwatchSpec, report: Report | None = None) -> addons.NodeAddons:
    files = [(f"{SUBDIR}/config.json", json.dumps(settings.model_dump(mode="json")).encode())]
    env: list[tuple[str, str]] = []
    secret_env: tuple[tuple[str, str], ...] = ()
    if report is not None:
        env.append((REPORT_URL_VARIABLE, f"{report.server.rstrip('/')}{AGENTS_ROUTE}/{{node}}"))
        secret_env = ((REPORT_TOKEN_VARIABLE, report.token),)
        if report.ca is not None:
            files.append((f"{SUBDIR}/ca.crt", report.ca))
            env.append((REPORT_CA_VARIABLE, f"{DIR}/ca.crt"))
    # The agent sees the node's process ids and may ptrace them for stacks: it runs in the node's isolation.
    agent = addons.Sidecar(
        spec_mod.HANGWATCH_SIDECAR,
        ("{python}", "-m", "raypod.capabilities.hangwatch.agent", DIR),
        env=tuple(env),
        secret_env=secret_env,
    )
    return addons.NodeAddons(
        env=((layout.DIR_VARIABLE, DIR),),
        env_lists=((layout.CALLBACKS_VARIABLE, layout.CALLBACK),),
        files=tuple(files),
        sidecars=(agent,),
    )
