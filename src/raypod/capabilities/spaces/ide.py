"""How an IDE server is started on a workspace's node: its command, environment and files. Pure, but for
finding the programs."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

from raypod.spec import SpaceKind

# The IDE's own token reaches it in the environment, never on its command line (which every user of the host
# can read in the process list); JupyterLab's is read by jupyter_identity.
TOKEN_VARIABLE = {SpaceKind.JUPYTERLAB: "RAYPOD_SPACE_TOKEN", SpaceKind.CODE_EDITOR: "PASSWORD"}


def missing(kind: SpaceKind) -> str | None:
    """Why ``kind`` cannot run on this host (with how to install it), or None."""
    if kind is SpaceKind.JUPYTERLAB and importlib.util.find_spec("jupyterlab") is None:
        return "JupyterLab is not installed where raypod runs: pip install 'raypod[spaces]' (or jupyterlab)"
    if kind is SpaceKind.CODE_EDITOR and shutil.which("code-server") is None:
        return "the code editor needs code-server, which is not installed: npm install -g code-server"
    return None


def files_dir(home: Path, namespace: str, name: str) -> Path:
    """A workspace's files: by namespace and name, not by cluster, so they outlive its node, a stop, the
    cluster, and a move to another cluster."""
    return home / "spaces" / namespace / name / "files"


def command(kind: SpaceKind, port: int, base_path: str, root: Path) -> list[str]:
    """The IDE server on loopback at ``port``, serving under ``base_path`` (the gateway forwards the full path)."""
    if kind is SpaceKind.JUPYTERLAB:
        return [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--allow-root",
            "--ip=127.0.0.1",
            f"--port={port}",
            "--port-retries=0",
            f"--ServerApp.base_url={base_path}",
            f"--ServerApp.root_dir={root}",
            # The gateway is the only client: it authenticates users and presents the IDE's token itself.
            "--ServerApp.identity_provider_class=raypod.capabilities.spaces.jupyter_identity.GatewayIdentityProvider",
            "--ServerApp.allow_remote_access=False",
            "--ServerApp.open_browser=False",
            "--LabApp.news_url=",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ]
    return [
        str(shutil.which("code-server") or "code-server"),
        f"--bind-addr=127.0.0.1:{port}",
        "--auth=password",
        "--disable-telemetry",
        "--disable-update-check",
        str(root),
    ]


def environment(
    base: dict[str, str],
    kind: SpaceKind,
    token: str,
    root: Path,
    gcs_address: str,
    server: str | None = None,
    ca_file: Path | None = None,
) -> dict[str, str]:
    """The node's environment, with the IDE's token, its home in the workspace's files (so settings and
    kernels' files persist), the cluster's address for ``ray.init(address="auto")``, and where raypod is, so
    ``raypod.Client(token=...)`` in a notebook needs nothing else (the user's token is theirs to give)."""
    env = {**base, TOKEN_VARIABLE[kind]: token, "HOME": str(root), "RAY_ADDRESS": gcs_address}
    env["JUPYTER_RUNTIME_DIR"] = str(root / ".local" / "share" / "jupyter" / "runtime")
    if server:
        env["RAYPOD_SERVER"] = server
    if ca_file is not None:
        env["RAYPOD_CA_FILE"] = str(ca_file)
    return env


def copy_ca(ca_file: str | None, root: Path) -> Path | None:
    """raypod's CA certificate (public) into the workspace's files, where its node can read it."""
    if not ca_file or not Path(ca_file).is_file():
        return None
    target = root / ".raypod" / "ca.crt"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(ca_file, target)
    return target
