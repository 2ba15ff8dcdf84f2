"""Run a real Prometheus as a plain background process for ``raypod monitoring up|down|status``: generated
config, data and a 0600 token file under ``$RAYPOD_HOME/monitoring``, listening on loopback.

Loopback is not private on a shared host (every job of every cluster can reach it), and every tenant's metrics are
in it: its HTTP API takes only basic auth (``--web.config.file``, a bcrypt hash of a password raypod makes and
keeps 0600 beside it, ``config.PROMETHEUS_PASSWORD_FILE``). raypod's server and CLI present it; nodes never get it."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import bcrypt
import httpx
import psutil
import yaml

from raypod import config, errors
from raypod.capabilities.observability import prometheus

DEFAULT_PORT = 9090  # where Ray's dashboard looks for Prometheus by default
INSTALL_HINT = "install it with 'sudo apt-get install prometheus' (Debian/Ubuntu) or set RAYPOD_PROMETHEUS_BIN"


@dataclass(frozen=True)
class Running:
    pid: int
    url: str
    token_id: str
    config: str
    log: str


def binary() -> str:
    """The Prometheus executable.

    Raises:
        NotFound: Prometheus is not installed; the message says how to install it.
    """
    found = os.environ.get("RAYPOD_PROMETHEUS_BIN") or shutil.which("prometheus")
    if not found or not os.access(found, os.X_OK):
        raise errors.NotFound(f"Prometheus is not installed: {INSTALL_HINT}")
    return found


def _state_file(home: Path) -> Path:
    return config.monitoring_dir(home) / "prometheus.json"


def read(home: Path) -> Running | None:
    """The Prometheus this home started, if its process is still the one recorded."""
    try:
        data = json.loads(_state_file(home).read_text())
        running = Running(**data)
    except (OSError, ValueError, TypeError):
        return None
    try:
        process = psutil.Process(running.pid)
        if "prometheus" not in " ".join(process.cmdline()) or process.status() == psutil.STATUS_ZOMBIE:
            return None
    except psutil.Error:
        return None
    return running


def _write_private(path: Path, text: str) -> None:
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)


USER = "raypod"


def credentials(home: Path) -> tuple[str, str] | None:
    """The basic-auth user and password of the Prometheus this home runs, if any."""
    return config.MonitoringEndpoints.read(home).prometheus_auth


def start(
    home: Path,
    server_url: str,
    token: str,
    token_id: str,
    ca_file: Path | None,
    port: int = DEFAULT_PORT,
    scrape_interval: str = prometheus.SCRAPE_INTERVAL,
    timeout: float = 60.0,
) -> Running:
    """Write the config and start Prometheus detached; wait until it is ready; record where it answers so the
    server's chart endpoint and new Ray heads use it.

    Raises:
        NotFound: Prometheus is not installed. Conflict: the port is taken. TransientError: it did not start.
    """
    executable = binary()
    folder = config.monitoring_dir(home)
    (folder / "data").mkdir(parents=True, exist_ok=True)
    token_file = folder / "token"
    _write_private(token_file, token)
    config_file = folder / "prometheus.yml"
    config_file.write_text(
        yaml.safe_dump(prometheus.config(server_url, token_file, ca_file, scrape_interval), sort_keys=False)
    )
    password = secrets.token_urlsafe(24)
    _write_private(folder / config.PROMETHEUS_PASSWORD_FILE, password)
    web_config = folder / "web.yml"
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt()).decode()
    _write_private(web_config, yaml.safe_dump({"basic_auth_users": {USER: hashed}}))
    auth = (USER, password)
    url = f"http://127.0.0.1:{port}"
    if _answers(url):
        raise errors.Conflict(f"something already answers on {url}; pass --port to use another port")
    log_path = folder / "prometheus.log"
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [
                executable,
                f"--config.file={config_file}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                f"--web.config.file={web_config}",
                "--storage.tsdb.retention.time=15d",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    running = Running(pid=process.pid, url=url, token_id=token_id, config=str(config_file), log=str(log_path))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _ready(url, auth):
            _state_file(home).write_text(json.dumps(asdict(running)))
            (folder / "endpoints.json").write_text(json.dumps({"prometheus_url": url}))
            return running
        if process.poll() is not None:
            break
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, signal.SIGKILL)
    tail = log_path.read_text(errors="replace")[-600:]
    raise errors.TransientError(f"Prometheus did not start; see {log_path}:\n{tail}")


def stop(home: Path, timeout: float = 30.0) -> Running | None:
    """Stop the recorded Prometheus (its data stays) and forget its endpoint. Returns what was stopped."""
    running = read(home)
    folder = config.monitoring_dir(home)
    for name in ("prometheus.json", "endpoints.json", "token", config.PROMETHEUS_PASSWORD_FILE, "web.yml"):
        (folder / name).unlink(missing_ok=True)
    if running is None:
        return None
    with contextlib.suppress(ProcessLookupError):
        os.kill(running.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not psutil.pid_exists(running.pid) or psutil.Process(running.pid).status() == psutil.STATUS_ZOMBIE:
                break
            time.sleep(0.2)
        else:
            os.kill(running.pid, signal.SIGKILL)
    return running


def targets(url: str, auth: tuple[str, str] | None = None) -> list[dict[str, Any]]:
    """Prometheus' active targets (job, labels, health, last error)."""
    response = httpx.get(f"{url}/api/v1/targets", params={"state": "active"}, timeout=5, auth=auth)
    response.raise_for_status()
    found: list[dict[str, Any]] = response.json()["data"]["activeTargets"]
    return found


def _ready(url: str, auth: tuple[str, str]) -> bool:
    try:
        return httpx.get(f"{url}/-/ready", timeout=1, auth=auth).status_code == 200
    except httpx.HTTPError:
        return False


def _answers(url: str) -> bool:
    """Whether anything at all answers there (a Prometheus of someone else's answers 401 to us)."""
    try:
        httpx.get(f"{url}/-/ready", timeout=1)
    except httpx.HTTPError:
        return False
    return True
