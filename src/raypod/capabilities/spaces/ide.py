"""How an IDE server is started on a workspace's node: its command, environment and files. Pure, but for
finding the programs."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import stat
from pathlib import Path

from raypod import addons as addons_mod
from raypod import spec as spec_mod
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
    None. Only reads the environment's package metadata: the directory is the user's (a job may have written
    it), so nothing in it is run with the server's rights; a kernel that fails later fails inside the node."""
    interpreter = Path(python_env) / "bin" / "python"
    if not interpreter.exists():
        return "python_env: give the directory of a virtual environment that the cluster's nodes can read"
    install = f"{interpreter} -m pip install 'ray[default]=={ray_version}' ipykernel"
    versions = installed_versions(Path(python_env), ("ray", "ipykernel"))
    if "ray" not in versions or "ipykernel" not in versions:
        return f"python_env: {python_env} lacks ipykernel or Ray; install them with: {install}"
    if versions["ray"] != ray_version:
        return f"python_env: {python_env} has Ray {versions['ray']}; the cluster runs {ray_version}: {install}"
    return None


_MAX_METADATA_BYTES = 1 << 20


def installed_versions(environment: Path, names: tuple[str, ...]) -> dict[str, str]:
    """The versions of ``names`` a virtual environment has, from its ``*.dist-info/METADATA`` files (what pip
    writes); regular files only, read with a cap."""
    found: dict[str, str] = {}
    sites = sorted(environment.glob("lib/python3*/site-packages"))[:4]
    for site in list(sites):
        sites += _pth_dirs(site)  # what the environment's .pth files add to its path (another installation's)
    for site in sites:
        for name in names:
            for info in sorted(site.glob(f"{name}-*.dist-info"))[:4]:
                version = _metadata_version(info / "METADATA", name)
                if version is not None:
                    found.setdefault(name, version)
    return found


def _pth_dirs(site: Path) -> list[Path]:
    """The directories the .pth files of ``site`` name (path lines only: lines that import are never run)."""
    found: list[Path] = []
    for pth in sorted(site.glob("*.pth"))[:16]:
        text = _read_capped(pth)
        for line in (text or "").splitlines()[:64]:
            line = line.strip()
            if line and not line.startswith(("#", "import")) and Path(line).is_absolute() and Path(line).is_dir():
                found.append(Path(line))
    return found[:16]


def _read_capped(path: Path) -> str | None:
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(descriptor, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            return None
        return handle.read(_MAX_METADATA_BYTES).decode("utf-8", "replace")


def _metadata_version(path: Path, name: str) -> str | None:
    text = _read_capped(path)
    if text is None:
        return None
    fields = dict(
        line.split(": ", 1) for line in text.split("\n\n", 1)[0].splitlines() if ": " in line and line[0] != " "
    )
    if fields.get("Name", "").lower().replace("_", "-") != name:
        return None
    return fields.get("Version", "").strip() or None


def env_kernel(python_env: str) -> bytes:
    """The kernel spec of a workspace's own Python environment."""
    spec = {
        "argv": [str(Path(python_env) / "bin" / "python"), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"Python ({Path(python_env).name})",
        "language": "python",
        "metadata": {"raypod": {"python_env": python_env}},
    }
    return json.dumps(spec, indent=1).encode()


def addons(
    space: spec_mod.SpaceSpec, base_path: str, files: Path, server: str | None, ca: bytes | None
) -> addons_mod.NodeAddons:
    """What a workspace adds to its node: its files, its IDE as a sidecar (published as ``space/<name>`` once it
    answers) and, in the node's add-on directory, raypod's CA and the kernel of its own Python environment."""
    kind = space.kind
    extra: list[tuple[str, bytes]] = []
    env = [
        (TOKEN_VARIABLE[kind], "{token}"),
        ("HOME", str(files)),  # settings and kernels' files persist with the workspace
        ("RAY_ADDRESS", "{gcs}"),
        ("JUPYTER_RUNTIME_DIR", str(files / ".local" / "share" / "jupyter" / "runtime")),
    ]
    if space.python_env:
        extra.append((f"ide/jupyter/kernels/{ENV_KERNEL}/kernel.json", env_kernel(space.python_env)))
        env.append(("JUPYTER_PATH", "{addon_dir}/ide/jupyter"))
    if server:
        env.append(("RAYPOD_SERVER", server))  # raypod.Client(token=...) in a notebook needs nothing else
    if ca is not None:
        extra.append(("ide/ca.crt", ca))
        env.append(("RAYPOD_CA_FILE", "{addon_dir}/ide/ca.crt"))
    if kind is SpaceKind.JUPYTERLAB:
        probe = addons_mod.Probe(f"{base_path}api/status", (("Authorization", "token {token}"),))
    else:
        probe = addons_mod.Probe("/healthz")
    ide = addons_mod.Sidecar(
        spec_mod.IDE_SIDECAR,
        tuple(command(kind, base_path, files, space.python_env)),
        env=tuple(env),
        cwd=str(files),
        ready=probe,
        endpoint=f"space/{space.name}",
    )
    return addons_mod.NodeAddons(files=tuple(extra), binds=(str(files),), sidecars=(ide,))


def files_dir(home: Path, namespace: str, name: str, owner: str | None) -> Path:
    """A workspace's files: by an id of its namespace, name and owner, not by cluster, so they outlive its node, a
    stop, the cluster, and a move to another cluster; another user who later takes the same name (once the
    workspace is deleted) gets files of their own, never the first owner's. Files of a workspace made before
    these ids (by namespace and name) are moved here once, at its next start."""
    key = hashlib.sha256(f"{namespace}\0{name}\0{owner or ''}".encode()).hexdigest()[:24]
    current = home / "spaces" / "by-id" / key / "files"
    legacy = home / "spaces" / namespace / name / "files"
    if not current.exists() and legacy.is_dir() and not legacy.is_symlink():
        current.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            legacy.rename(current)
    return current


def command(kind: SpaceKind, base_path: str, root: Path, python_env: str | None = None) -> list[str]:
    """The IDE server on loopback at the sidecar's ``{port}``, serving under ``base_path`` (the gateway forwards the
    full path); with ``python_env``, its kernels run there by default."""
    if kind is SpaceKind.JUPYTERLAB:
        return [
            "{python}",
            "-m",
            "jupyterlab",
            "--no-browser",
            "--allow-root",
            "--ip={host}",
            "--port={port}",
            "--port-retries=0",
            f"--ServerApp.base_url={base_path}",
            f"--ServerApp.root_dir={root}",
            # The gateway is the only client: it authenticates users and presents the IDE's token itself.
            "--ServerApp.identity_provider_class=raypod.capabilities.spaces.jupyter_identity.GatewayIdentityProvider",
            # A pod's IDE is reached through its Service (a Host that is not local); only the gateway reaches it, with
            # the token, so the Host check (which guards IDEs browsers reach directly) has nothing to add.
            "--ServerApp.allow_remote_access=True",
            "--ServerApp.open_browser=False",
            "--LabApp.news_url=",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            *([f"--MappingKernelManager.default_kernel_name={ENV_KERNEL}"] if python_env else []),
        ]
    return [
        str(shutil.which("code-server") or "code-server"),
        "--bind-addr={host}:{port}",
        "--auth=password",
        "--disable-telemetry",
        "--disable-update-check",
        str(root),
    ]
