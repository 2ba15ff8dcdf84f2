"""Whether a workspace's IDE is in use, for idle suspension: JupyterLab says when each kernel and terminal was last
active and whether a kernel is running code (its REST API, with the IDE's token, through the node's sidecar)."""

from __future__ import annotations

from datetime import datetime

import httpx

from raypod import spec as spec_mod


def last_activity(ide: str, base_path: str, token: str, kind: spec_mod.SpaceKind, http: httpx.Client) -> float | None:
    """When the workspace last ran code or had terminal input (seconds since the epoch; 0.0: never), or None while a
    kernel is not idle, or when it cannot be told (a code editor, which says nothing of this; an IDE that does not
    answer): what is not known to be idle is not."""
    if kind is not spec_mod.SpaceKind.JUPYTERLAB:
        return None
    latest = 0.0
    try:
        for what in ("kernels", "terminals"):
            response = http.get(f"{ide}{base_path}api/{what}", headers={"Authorization": f"token {token}"}, timeout=5)
            response.raise_for_status()
            for item in response.json():
                if what == "kernels" and item.get("execution_state") != "idle":
                    return None
                stamp = item.get("last_activity")
                if stamp:
                    latest = max(latest, datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp())
    except (httpx.HTTPError, ValueError, TypeError, AttributeError):
        return None
    return latest
