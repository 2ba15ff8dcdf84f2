"""The Python SDK. ``raypod.Client`` is what the CLI itself uses; it reaches the server only over HTTP."""

from __future__ import annotations

import builtins
import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

import httpx

from raypod import config, errors, state
from raypod import spec as spec_mod
from raypod.client._http import Transport
from raypod.serving import catalog

T = TypeVar("T")


class Clusters:
    """Cluster verbs; names match the CLI (``raypod cluster scale``) and the API (``POST .../scale``)."""

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def create(self, spec: spec_mod.ClusterSpec | dict[str, Any]) -> state.ClusterView:
        body = spec.model_dump(mode="json") if isinstance(spec, spec_mod.ClusterSpec) else spec
        return state.ClusterView.model_validate(self._t.request("POST", "/api/v1/clusters", json=body))

    def get(self, name: str, namespace: str = "default") -> state.ClusterView:
        return state.ClusterView.model_validate(self._t.request("GET", _path(namespace, name)))

    def list(self, namespace: str | None = None) -> list[state.ClusterView]:
        params = {"namespace": namespace} if namespace else {}
        return [
            state.ClusterView.model_validate(item) for item in self._t.request("GET", "/api/v1/clusters", params=params)
        ]

    def scale(self, name: str, group: str, replicas: int, namespace: str = "default") -> state.ClusterView:
        payload = self._t.request("POST", _path(namespace, name, "scale"), json={"group": group, "replicas": replicas})
        return state.ClusterView.model_validate(payload)

    def delete(self, name: str, namespace: str = "default") -> state.ClusterView:
        return state.ClusterView.model_validate(self._t.request("DELETE", _path(namespace, name)))

    def replace_node(self, name: str, node: str, namespace: str = "default") -> state.ClusterView:
        """Drain (when it answers) and replace one node, whatever the recovery mode or the flapping guard."""
        return self._node_action(name, node, "replace", namespace)

    def cordon_node(self, name: str, node: str, namespace: str = "default") -> state.ClusterView:
        """Hold a node out of automatic recovery (to inspect it) until ``uncordon_node``."""
        return self._node_action(name, node, "cordon", namespace)

    def uncordon_node(self, name: str, node: str, namespace: str = "default") -> state.ClusterView:
        return self._node_action(name, node, "uncordon", namespace)

    def _node_action(self, name: str, node: str, action: str, namespace: str) -> state.ClusterView:
        payload = self._t.request("POST", _path(namespace, name, f"nodes/{node}/{action}"))
        return state.ClusterView.model_validate(payload)

    def events(self, name: str, namespace: str = "default", limit: int = 200) -> builtins.list[state.Event]:
        payload = self._t.request("GET", _path(namespace, name, "events"), params={"limit": limit})
        return [state.Event.model_validate(item) for item in payload]

    def manifest(self, name: str, namespace: str = "default") -> dict[str, Any]:
        result: dict[str, Any] = self._t.request("GET", _path(namespace, name, "manifest"))
        return result

    def wait_ready(
        self,
        name: str,
        namespace: str = "default",
        timeout: float = 300.0,
        on_progress: Callable[[state.ClusterView], None] | None = None,
    ) -> state.ClusterView:
        """Poll until every desired node runs.

        Raises:
            TransientError: not ready within ``timeout``. PermanentError: the cluster failed.
        """
        return _poll(
            lambda: self.get(name, namespace),
            lambda v: v.status.phase is state.ClusterPhase.READY and v.status.observed_generation == v.generation,
            timeout=timeout,
            every=0.25,
            on_progress=on_progress,
            failed=lambda v: (
                errors.PermanentError(f"cluster '{name}' failed: {v.status.message}")
                if v.status.phase is state.ClusterPhase.FAILED
                else None
            ),
            late=lambda v: (
                f"cluster '{name}' not ready after {timeout:.0f} s ({v.status.message}); "
                f"see 'raypod cluster events {name}'"
            ),
        )

    def wait_deleted(self, name: str, namespace: str = "default", timeout: float = 120.0) -> None:
        """Poll until the cluster is gone.

        Raises:
            TransientError: still there after ``timeout``.
        """

        def gone() -> bool:
            try:
                self.get(name, namespace)
            except errors.NotFound:
                return True
            return False

        late = f"cluster '{name}' still being deleted after {timeout:.0f} s"
        _poll(gone, bool, timeout=timeout, every=0.25, late=lambda _: late)


class Jobs:
    """Job verbs; names match ``raypod job submit|list|get|logs|stop`` and ``/api/v1/.../jobs``."""

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def submit(
        self, cluster: str, spec: spec_mod.JobSpec | dict[str, Any], namespace: str = "default"
    ) -> state.JobView:
        """Submit a raypod job (retried ``max_retries`` times after a FAILED attempt)."""
        body = spec.model_dump(mode="json") if isinstance(spec, spec_mod.JobSpec) else spec
        return state.JobView.model_validate(self._t.request("POST", _path(namespace, cluster, "jobs"), json=body))

    def list(self, cluster: str, namespace: str = "default") -> builtins.list[state.JobView]:
        """Every job of a cluster, those submitted with plain Ray tooling included (``submitted_via``)."""
        return [state.JobView.model_validate(j) for j in self._t.request("GET", _path(namespace, cluster, "jobs"))]

    def get(self, job_id: str) -> state.JobView:
        return state.JobView.model_validate(self._t.request("GET", f"/api/v1/jobs/{_job_id(job_id)}"))

    def stop(self, job_id: str) -> state.JobView:
        return state.JobView.model_validate(self._t.request("POST", f"/api/v1/jobs/{_job_id(job_id)}/stop"))

    def logs(self, job_id: str, attempt: int | None = None) -> str:
        params = {"attempt": attempt} if attempt else {}
        payload = self._t.request("GET", f"/api/v1/jobs/{_job_id(job_id)}/logs", params=params)
        return state.JobLogs.model_validate(payload).logs

    def hangs(
        self, cluster: str, job: str | None = None, namespace: str = "default", limit: int = 100
    ) -> builtins.list[state.HangDetection]:
        """Hung or faulted Ray Train runs of a cluster (of one job), newest first, with each rank's stack."""
        params: dict[str, Any] = {"limit": limit, **({"job": _job_id(job)} if job else {})}
        found = self._t.request("GET", _path(namespace, cluster, "hangs"), params=params)
        return [state.HangDetection.model_validate(d) for d in found]

    def training(self, cluster: str, namespace: str = "default") -> builtins.list[state.RunProgress]:
        """Live Ray Train runs of a cluster, each rank's progress as the nodes' agents see it."""
        return [
            state.RunProgress.model_validate(r) for r in self._t.request("GET", _path(namespace, cluster, "training"))
        ]

    def upload_working_dir(
        self, cluster: str, files: builtins.list[tuple[str, bytes]], namespace: str = "default"
    ) -> str:
        """Upload files (paths relative to a folder) as a Ray package; returns its ``gcs://`` URI."""
        upload = [("files", (name, data)) for name, data in files]
        payload = self._t.request("POST", _path(namespace, cluster, "working-dirs"), files=upload)
        return state.WorkingDir.model_validate(payload).uri

    def wait(
        self,
        job_id: str,
        timeout: float = 3600.0,
        on_progress: Callable[[state.JobView], None] | None = None,
    ) -> state.JobView:
        """Poll until the job succeeded, failed or stopped.

        Raises:
            TransientError: still running after ``timeout``.
        """
        return _poll(
            lambda: self.get(job_id),
            lambda job: job.status in TERMINAL_JOB_STATUSES,
            timeout=timeout,
            every=0.5,
            on_progress=on_progress,
            late=lambda job: f"job {job_id} still {job.status.value} after {timeout:.0f} s",
        )


class Models:
    """The model catalog; names match ``raypod model list|add|show|remove`` and ``/api/v1/models``."""

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def list(self) -> builtins.list[catalog.ModelEntry]:
        return [catalog.ModelEntry.model_validate(m) for m in self._t.request("GET", "/api/v1/models")]

    def get(self, model_id: str) -> catalog.ModelEntry:
        return catalog.ModelEntry.model_validate(self._t.request("GET", f"/api/v1/models/{model_id}"))

    def add(
        self,
        model_id: str,
        source: str,
        storage_options: dict[str, Any] | None = None,
        description: str = "",
        replace: bool = False,
        timeout: float = 1800.0,
    ) -> catalog.ModelEntry:
        """The server reads and checksums every file of ``source`` (minutes for a large model)."""
        body = catalog.ModelSource(
            id=model_id, source=source, storage_options=storage_options or {}, description=description
        )
        payload = self._t.request(
            "POST", "/api/v1/models", json=body.model_dump(mode="json"), params={"replace": replace}, timeout=timeout
        )
        return catalog.ModelEntry.model_validate(payload)

    def remove(self, model_id: str) -> catalog.ModelEntry:
        return catalog.ModelEntry.model_validate(self._t.request("DELETE", f"/api/v1/models/{model_id}"))


class Serving:
    """Models on a cluster's Ray Serve; names match ``raypod serve deploy|list|status|delete``."""

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def deploy(
        self,
        cluster: str,
        spec: spec_mod.ServeDeploySpec | dict[str, Any] | str,
        namespace: str = "default",
        timeout: float = 1800.0,
    ) -> state.DeploymentView:
        """Start a catalog model (``spec`` may be just its id). Checked first: it fits and its files are intact."""
        if isinstance(spec, str):
            spec = spec_mod.ServeDeploySpec(model=spec)
        body = spec.model_dump(mode="json") if isinstance(spec, spec_mod.ServeDeploySpec) else spec
        payload = self._t.request("POST", _path(namespace, cluster, "deployments"), json=body, timeout=timeout)
        return state.DeploymentView.model_validate(payload)

    def list(self, cluster: str, namespace: str = "default") -> builtins.list[state.DeploymentView]:
        found = self._t.request("GET", _path(namespace, cluster, "deployments"))
        return [state.DeploymentView.model_validate(d) for d in found]

    def get(self, cluster: str, name: str, namespace: str = "default") -> state.DeploymentView:
        payload = self._t.request("GET", _path(namespace, cluster, f"deployments/{name}"))
        return state.DeploymentView.model_validate(payload)

    def delete(self, cluster: str, name: str, namespace: str = "default") -> state.DeploymentView:
        payload = self._t.request("DELETE", _path(namespace, cluster, f"deployments/{name}"))
        return state.DeploymentView.model_validate(payload)

    def wait_running(
        self,
        cluster: str,
        name: str,
        namespace: str = "default",
        timeout: float = 600.0,
        on_progress: Callable[[state.DeploymentView], None] | None = None,
    ) -> state.DeploymentView:
        """Poll until Serve runs it. Raises InvalidSpec (it failed to deploy: the message says why),
        TransientError (not running after ``timeout``)."""
        return _poll(
            lambda: self.get(cluster, name, namespace),
            lambda d: d.status == "RUNNING",
            timeout=timeout,
            every=1.0,
            on_progress=on_progress,
            failed=lambda d: (
                errors.InvalidSpec(f"deployment {name} failed: {d.message}") if d.status == "DEPLOY_FAILED" else None
            ),
            late=lambda d: f"deployment {name} still {d.status} after {timeout:.0f} s",
        )

    def openai_base_url(self, cluster: str, name: str, namespace: str = "default") -> str:
        """What to give an OpenAI client as ``base_url`` (with a raypod token as its ``api_key``)."""
        return f"{self._t.server.rstrip('/')}/clusters/{namespace}/{cluster}/serve/{name}/v1"


class Spaces:
    """Workspaces: IDEs that join a cluster as zero-compute nodes; names match ``raypod space ...``."""

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def create(
        self,
        name: str,
        cluster: str,
        kind: str = "jupyterlab",
        namespace: str = "default",
        memory: str | int | None = None,
        python_env: str | None = None,
    ) -> state.SpaceView:
        """``python_env``: a Python environment's directory on the nodes' host whose interpreter runs the kernels
        (it needs ipykernel and the cluster's Ray version)."""
        body: dict[str, Any] = {"name": name, "cluster": cluster, "kind": kind}
        if memory is not None:
            body["memory"] = memory
        if python_env is not None:
            body["python_env"] = python_env
        return state.SpaceView.model_validate(
            self._t.request("POST", f"/api/v1/namespaces/{namespace}/spaces", json=body)
        )

    def list(self, namespace: str | None = None) -> builtins.list[state.SpaceView]:
        path = f"/api/v1/namespaces/{namespace}/spaces" if namespace else "/api/v1/spaces"
        return [state.SpaceView.model_validate(s) for s in self._t.request("GET", path)]

    def get(self, name: str, namespace: str = "default") -> state.SpaceView:
        return state.SpaceView.model_validate(self._t.request("GET", f"/api/v1/namespaces/{namespace}/spaces/{name}"))

    def stop(self, name: str, namespace: str = "default") -> state.SpaceView:
        return self._verb(name, namespace, "stop")

    def start(self, name: str, namespace: str = "default") -> state.SpaceView:
        return self._verb(name, namespace, "start")

    def move(self, name: str, cluster: str, namespace: str = "default") -> state.SpaceView:
        return self._verb(name, namespace, "move", {"cluster": cluster})

    def delete(self, name: str, namespace: str = "default", keep_files: bool = True) -> state.SpaceView:
        path = f"/api/v1/namespaces/{namespace}/spaces/{name}"
        payload = self._t.request("DELETE", path, params={"keep_files": str(keep_files).lower()})
        return state.SpaceView.model_validate(payload)

    def wait_ready(
        self,
        name: str,
        namespace: str = "default",
        timeout: float = 300.0,
        on_progress: Callable[[state.SpaceView], None] | None = None,
    ) -> state.SpaceView:
        """Poll until its IDE answers. Raises TransientError (not ready after ``timeout``)."""
        return _poll(
            lambda: self.get(name, namespace),
            lambda space: space.state == "Ready",
            timeout=timeout,
            every=0.25,
            on_progress=on_progress,
            late=lambda space: f"workspace {name} still {space.state} after {timeout:.0f} s: {space.message}",
        )

    def url(self, name: str, namespace: str = "default") -> str:
        """The workspace's IDE, on raypod's server (a browser logged in to the console opens it)."""
        return f"{self._t.server.rstrip('/')}/spaces/{namespace}/{name}/"

    def _verb(self, name: str, namespace: str, verb: str, body: dict[str, Any] | None = None) -> state.SpaceView:
        path = f"/api/v1/namespaces/{namespace}/spaces/{name}/{verb}"
        return state.SpaceView.model_validate(self._t.request("POST", path, json=body))


class Tokens:
    """``raypod token create|list|revoke``; a created token's secret is in the answer only."""

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def create(
        self, name: str = "cli", ttl_seconds: int | None = 30 * 86400, user: str | None = None
    ) -> state.CreatedToken:
        body = {"name": name, "ttl_seconds": ttl_seconds, "user": user}
        return state.CreatedToken.model_validate(self._t.request("POST", "/api/v1/tokens", json=body))

    def list(self) -> builtins.list[state.TokenInfo]:
        return [state.TokenInfo.model_validate(t) for t in self._t.request("GET", "/api/v1/tokens")]

    def revoke(self, token_id: str) -> state.TokenInfo:
        """Revoke a token; browser sessions made from it end at once."""
        if not token_id.replace("-", "").isalnum() or len(token_id) > 16:
            raise errors.InvalidSpec(f"'{token_id[:40]}' is not a token id (see 'raypod token list')")
        return state.TokenInfo.model_validate(self._t.request("DELETE", f"/api/v1/tokens/{token_id}"))


class Users:
    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def create(
        self, name: str, team: str | None = None, role: state.Role = state.Role.MEMBER, is_admin: bool = False
    ) -> state.UserInfo:
        body = {"name": name, "team": team, "role": state.Role(role).value, "is_admin": is_admin}
        return state.UserInfo.model_validate(self._t.request("POST", "/api/v1/users", json=body))

    def list(self) -> builtins.list[state.UserInfo]:
        return [state.UserInfo.model_validate(u) for u in self._t.request("GET", "/api/v1/users")]

    def delete(self, name: str) -> state.OwnerDeleted:
        """Admins: revoke the user's tokens and sessions; its queued clusters leave the queue."""
        return state.OwnerDeleted.model_validate(self._t.request("DELETE", f"/api/v1/users/{_name(name)}"))

    def whoami(self) -> state.UserInfo:
        return state.UserInfo.model_validate(self._t.request("GET", "/api/v1/whoami"))


class Teams:
    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def create(self, name: str) -> state.TeamInfo:
        return state.TeamInfo.model_validate(self._t.request("POST", "/api/v1/teams", json={"name": name}))

    def add_member(self, team: str, user: str, role: state.Role = state.Role.MEMBER) -> state.UserInfo:
        body = {"user": user, "role": state.Role(role).value}
        return state.UserInfo.model_validate(self._t.request("POST", f"/api/v1/teams/{_name(team)}/members", json=body))


class Namespaces:
    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def create(self, name: str, team: str) -> state.NamespaceInfo:
        body = {"name": name, "team": team}
        return state.NamespaceInfo.model_validate(self._t.request("POST", "/api/v1/namespaces", json=body))

    def list(self) -> builtins.list[state.NamespaceInfo]:
        return [state.NamespaceInfo.model_validate(n) for n in self._t.request("GET", "/api/v1/namespaces")]


class Quotas:
    """Teams' quotas (team admins set them) and the queue of clusters waiting for admission."""

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def set(
        self, team: str | None, quota: spec_mod.QuotaSpec | dict[str, Any], *, namespace: str | None = None
    ) -> state.QuotaView:
        """A team's quota, or with ``namespace`` (and ``team`` None) a namespace's cap inside its team's."""
        body = quota.model_dump(mode="json", exclude_none=True) if isinstance(quota, spec_mod.QuotaSpec) else quota
        return state.QuotaView.model_validate(self._t.request("PUT", _quota_path(team, namespace), json=body))

    def get(self, team: str | None, *, namespace: str | None = None) -> state.QuotaView:
        return state.QuotaView.model_validate(self._t.request("GET", _quota_path(team, namespace)))

    def list(self) -> builtins.list[state.QuotaView]:
        """Teams' quotas, then namespaces' own (``namespace`` set)."""
        return [state.QuotaView.model_validate(q) for q in self._t.request("GET", "/api/v1/quotas")]

    def delete(self, team: str | None, *, namespace: str | None = None) -> None:
        self._t.request("DELETE", _quota_path(team, namespace))

    def kueue(self) -> builtins.list[dict[str, Any]]:
        """Admins: every quota as Kueue objects (to apply with kubectl where Kueue admits)."""
        found: list[dict[str, Any]] = self._t.request("GET", "/api/v1/quotas/kueue")
        return found

    def queue(self) -> builtins.list[state.QueueEntry]:
        """What waits, in the order it will be admitted, with why."""
        return [state.QueueEntry.model_validate(q) for q in self._t.request("GET", "/api/v1/queue")]


class Monitoring:
    """What Prometheus discovers, raypod's own metrics and a cluster's console charts."""

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def targets(self, job: str = "ray") -> builtins.list[dict[str, Any]]:
        """Prometheus HTTP service discovery: every alive node (``job="ray"``) or raypod itself (``"raypod"``)."""
        found: builtins.list[dict[str, Any]] = self._t.request("GET", "/api/v1/monitoring/sd", params={"job": job})
        return found

    def metrics(self) -> str:
        """raypod's own metrics in Prometheus' text format (admins)."""
        return str(self._t.request_text("GET", "/metrics"))

    def charts(self, cluster: str, namespace: str = "default") -> dict[str, Any]:
        result: dict[str, Any] = self._t.request("GET", _path(namespace, cluster, "charts"))
        return result


TERMINAL_JOB_STATUSES = frozenset({state.JobStatus.SUCCEEDED, state.JobStatus.FAILED, state.JobStatus.STOPPED})


@dataclasses.dataclass(frozen=True)
class ConnectionSettings:
    server: str
    token: str | None
    verify: str | bool


def connection_settings(
    server: str | None = None, token: str | None = None, verify: str | bool | None = None
) -> ConnectionSettings:
    """Where the server is and how to talk to it: arguments, then RAYPOD_SERVER / RAYPOD_TOKEN /
    RAYPOD_CA_FILE, then the credentials file in RAYPOD_HOME."""
    stored = config.read_credentials()
    ca_file = os.environ.get("RAYPOD_CA_FILE") or stored.get("ca_file")
    if verify is None:
        verify = ca_file if ca_file and os.path.exists(ca_file) else True
    return ConnectionSettings(
        server=server or config.default_server_url(),
        token=token or os.environ.get("RAYPOD_TOKEN") or stored.get("token"),
        verify=verify,
    )


class Client:
    """Entry point of the SDK: ``raypod.Client().clusters.create(spec)``.

    The server comes from ``server``, else ``RAYPOD_SERVER``, else the local default.
    """

    def __init__(
        self,
        server: str | None = None,
        timeout: float = 30.0,
        http: httpx.Client | None = None,
        token: str | None = None,
        verify: str | bool | None = None,
    ) -> None:
        settings = connection_settings(server, token, verify)
        self._transport = Transport(settings.server, timeout, http, settings.token, settings.verify)
        self.server = self._transport.server
        self.clusters = Clusters(self._transport)
        self.jobs = Jobs(self._transport)
        self.models = Models(self._transport)
        self.serving = Serving(self._transport)
        self.spaces = Spaces(self._transport)
        self.tokens = Tokens(self._transport)
        self.users = Users(self._transport)
        self.teams = Teams(self._transport)
        self.namespaces = Namespaces(self._transport)
        self.monitoring = Monitoring(self._transport)
        self.quotas = Quotas(self._transport)

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """Call any API route with this client's credentials; errors raise raypod.errors classes."""
        return self._transport.request(method, path, **kwargs)

    def health(self) -> dict[str, Any]:
        """The public liveness answer. Raises ServerUnreachable."""
        result: dict[str, Any] = self._transport.request("GET", "/healthz")
        return result

    def info(self) -> state.ServerInfo:
        """Version, backend and tenancy of the server (what isolates namespaces, and what does not)."""
        return state.ServerInfo.model_validate(self._transport.request("GET", "/api/v1/info"))

    def is_healthy(self) -> bool:
        try:
            self.health()
        except errors.RaypodError:
            return False
        return True

    def close(self) -> None:
        self._transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _quota_path(team: str | None, namespace: str | None) -> str:
    if (team is None) == (namespace is None):
        raise errors.InvalidSpec("give a team or a namespace, not both")
    if namespace is not None:
        return f"/api/v1/namespaces/{_name(namespace)}/quota"
    return f"/api/v1/teams/{_name(team or '')}/quota"


def _name(value: str, what: str = "name") -> str:
    if not spec_mod.DNS1123_LABEL.match(value) or len(value) > 63:
        raise errors.InvalidSpec(f"{what} '{value[:80]}' is not a valid DNS-1123 label")
    return value


def _job_id(value: str) -> str:
    if not value.startswith("rj-") or not value[3:].isalnum() or len(value) > 32:
        raise errors.InvalidSpec(f"'{value[:40]}' is not a raypod job id (rj-...); see 'raypod job list'")
    return value


def _path(namespace: str, name: str, verb: str | None = None) -> str:
    for value, what in ((namespace, "namespace"), (name, "cluster name")):
        if not spec_mod.DNS1123_LABEL.match(value) or len(value) > 63:
            raise errors.InvalidSpec(f"{what} '{value}' is not a valid DNS-1123 label")
    path = f"/api/v1/namespaces/{namespace}/clusters/{name}"
    return f"{path}/{verb}" if verb else path


__all__ = [
    "Client",
    "Clusters",
    "ConnectionSettings",
    "Jobs",
    "Monitoring",
    "Namespaces",
    "Teams",
    "Tokens",
    "Users",
    "connection_settings",
]


def _poll(
    fetch: Callable[[], T],
    done: Callable[[T], bool],
    *,
    timeout: float,
    every: float,
    late: Callable[[T], str],
    on_progress: Callable[[T], None] | None = None,
    failed: Callable[[T], errors.RaypodError | None] = lambda _: None,
) -> T:
    """``fetch()`` every ``every`` s until ``done`` says so. Raises what ``failed`` returns for an answer that will
    not get better, and TransientError(``late(last answer)``) past ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        found = fetch()
        if on_progress:
            on_progress(found)
        if done(found):
            return found
        problem = failed(found)
        if problem is not None:
            raise problem
        if time.monotonic() > deadline:
            raise errors.TransientError(late(found))
        time.sleep(every)
