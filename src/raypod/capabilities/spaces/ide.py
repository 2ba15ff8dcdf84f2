"""How an IDE server is started on a workspace's node: its command, environment and files. Pure, but for
finding the programs."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
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


ENV_KERNEL = "raypod-env"  # the kernel of a workspace's own Python environment: the default where one is given


def python_env_problem(python_env: str, ray_version: str) -> str | None:
    """Why the environment cannot run a notebook kernel that is a driver of a cluster on ``ray_version``, or
    None. Runs its interpreter once."""
    interpreter = Path(python_env) / "bin" / "python"
    if not interpreter.is_file():
        return f"python_env: {interpreter} does not exist (give the directory of a virtual environment)"
    probe = "import ipykernel, ray; print(ray.__version__)"
    try:
        done = subprocess.run([str(interpreter), "-c", probe], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"python_env: {interpreter} does not run ({type(exc).__name__})"
    install = f"{interpreter} -m pip install 'ray[default]=={ray_version}' ipykernel"
    if done.returncode != 0:
        return f"python_env: {python_env} lacks ipykernel or Ray; install them with: {install}"
    found = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "?"
    if found != ray_version:
        return f"python_env: {python_env} has Ray {found}; the cluster runs {ray_version}: {install}"
    return None


def write_env_kernel(root: Path, python_env: str) -> None:
    """The environment's kernel, in the workspace's own Jupyter data directory (its $HOME is ``root``)."""
    folder = root / ".local" / "share" / "jupyter" / "kernels" / ENV_KERNEL
    folder.mkdir(parents=True, exist_ok=True)
    spec = {
        "argv": [str(Path(python_env) / "bin" / "python"), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"Python ({Path(python_env).name})",
        "language": "python",
        "metadata": {"raypod": {"python_env": python_env}},
    }
    (folder / "kernel.json").write_text(json.dumps(spec, indent=1))


def files_dir(home: Path, namespace: str, name: str) -> Path:
    """A workspace's files: by namespace and name, not by cluster, so they outlive its node, a stop, the
    cluster, and a move to another cluster."""
    return home / "spaces" / namespace / name / "files"


def command(kind: SpaceKind, port: int, base_path: str, root: Path, python_env: str | None = None) -> list[str]:
    """The IDE server on loopback at ``port``, serving under ``base_path`` (the gateway forwards the full path);
    with ``python_env``, its kernels run there by default."""
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
            *([f"--MappingKernelManager.default_kernel_name={ENV_KERNEL}"] if python_env else []),
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
