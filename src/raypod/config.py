"""Settings from the environment. Read once where a process starts; passed down explicitly afterwards."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from raypod import errors
from raypod import outbound as outbound_mod

DEFAULT_PORT = 8471


def default_home() -> Path:
    return Path(os.environ.get("RAYPOD_HOME") or Path.home() / ".raypod")


def secure_home(home: Path) -> None:
    """Make ``home`` 0700 and the database and state files in it 0600: they hold users' env and runtime_env
    secrets, token hashes and the credentials. New files are created private (umask 077) by this process."""
    os.umask(0o077)
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(home, 0o700)
    for path in home.rglob("*"):
        if path.is_symlink():
            continue
        if path.is_dir():
            os.chmod(path, 0o700)
        elif path.is_file():
            os.chmod(path, 0o600)


def credentials_path() -> Path:
    return default_home() / "credentials"


def read_credentials() -> dict[str, str]:
    """The credentials file written on the server's first start (or by the user); missing means empty."""
    try:
        data = json.loads(credentials_path().read_text())
    except (OSError, ValueError):
        return {}
    return {k: str(v) for k, v in data.items() if v} if isinstance(data, dict) else {}


def write_credentials(path: Path, server_url: str, token: str, ca_file: Path | str | None, **sso: str | None) -> None:
    """Write the CLI/SDK credentials file, readable by its owner only (0600) from its first byte. ``sso``: what
    `raypod login` keeps to refresh its token (``refresh_token``, ``token_expires_at``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"server": server_url, "token": token, "ca_file": str(ca_file) if ca_file else None, **sso}
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        json.dump(data, handle, indent=2)
    os.chmod(path, 0o600)


def default_server_url() -> str:
    return os.environ.get("RAYPOD_SERVER") or read_credentials().get("server") or f"https://127.0.0.1:{DEFAULT_PORT}"


def _json_env(name: str) -> dict[str, Any]:
    raw = os.environ.get(name)
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        raise errors.InvalidSpec(f"{name} is not JSON: {raw[:100]}") from None
    if not isinstance(value, dict):
        raise errors.InvalidSpec(f"{name} is a JSON object of fsspec options")
    return value


def _float_env(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise errors.InvalidSpec(f"environment variable {name}={raw!r} is not a number") from None


def _at_least(name: str, default: int, minimum: int) -> int:
    value = int(_float_env(name, default))
    if value < minimum:
        raise errors.InvalidSpec(f"environment variable {name} is at least {minimum}")
    return value


DEFAULT_PRIORITY_CLASSES = {"low": 0, "normal": 100, "high": 1000}


def _priority_teams(raw: str | None) -> dict[str, tuple[str, ...]]:
    """``high=ops,ml;urgent=ops``: the teams that may use each class above normal."""
    found: dict[str, tuple[str, ...]] = {}
    for part in (raw or "").split(";"):
        if not part.strip():
            continue
        name, sep, teams = part.partition("=")
        if not sep or not name.strip():
            raise errors.InvalidSpec(f"RAYPOD_PRIORITY_TEAMS: '{part}' is not class=team,team")
        found[name.strip()] = tuple(t.strip() for t in teams.split(",") if t.strip())
    return found


def _priority_classes(raw: str | None) -> dict[str, int]:
    """``low=0,normal=100,high=1000``; ``normal`` must be among them (it is every spec's default)."""
    if not raw:
        return dict(DEFAULT_PRIORITY_CLASSES)
    classes: dict[str, int] = {}
    for part in raw.split(","):
        name, _, value = part.strip().partition("=")
        try:
            classes[name.strip()] = int(value)
        except ValueError:
            raise errors.InvalidSpec(f"RAYPOD_PRIORITY_CLASSES: '{part}' is not name=integer") from None
    if "normal" not in classes:
        raise errors.InvalidSpec("RAYPOD_PRIORITY_CLASSES must define 'normal' (every spec's default)")
    return classes


def _optional_float_env(name: str) -> float | None:
    return _float_env(name, -1.0) if os.environ.get(name) else None


def _optional_int(value: float | None) -> int | None:
    return None if value is None else int(value)


def _choice_env(name: str, choices: tuple[str, ...], default: str) -> str:
    raw = os.environ.get(name) or default
    if raw not in choices:
        raise errors.InvalidSpec(f"environment variable {name}={raw!r} must be one of: {', '.join(choices)}")
    return raw


def _names_env(name: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in os.environ.get(name, "").split(",") if part.strip())
    bad = [n for n in names if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n) or n.startswith(("RAYPOD_", "RAY_"))]
    if bad:
        raise errors.InvalidSpec(f"{name}: '{bad[0]}' is not a variable name a node may inherit")
    return names


@dataclass(frozen=True)
class GroupGrant:
    """What membership of one provider group gives: a role in a team, or installation admin."""

    team: str | None = None
    role: str = "member"  # state.Role's values
    installation_admin: bool = False


@dataclass(frozen=True)
class SsoSettings:
    """Single sign-on with an OpenID Connect provider (docs/sso.md); every field has an environment variable."""

    issuer: str
    client_id: str
    client_secret: str = field(repr=False)
    redirect_url: str | None = None  # default: <public URL>/login/sso/callback
    scopes: str = "openid profile email groups offline_access"
    username_claim: str = "preferred_username"
    groups_claim: str = "groups"
    groups: dict[str, tuple[GroupGrant, ...]] = field(default_factory=dict)
    session_ttl: timedelta = timedelta(hours=8)  # a console session, at most
    token_ttl: timedelta = timedelta(hours=1)  # a CLI/SDK token; `raypod login` refreshes it through the provider
    leeway_s: int = 60  # clock skew allowed on an ID token's times
    display_name: str = "single sign-on"

    @classmethod
    def from_env(cls) -> SsoSettings | None:
        issuer = os.environ.get("RAYPOD_SSO_ISSUER")
        if not issuer:
            return None
        client_id = os.environ.get("RAYPOD_SSO_CLIENT_ID") or ""
        secret_file = os.environ.get("RAYPOD_SSO_CLIENT_SECRET_FILE")
        try:
            secret = Path(secret_file).read_text().strip() if secret_file else ""
        except OSError as exc:
            raise errors.InvalidSpec(f"RAYPOD_SSO_CLIENT_SECRET_FILE cannot be read ({exc.strerror})") from None
        secret = secret or os.environ.get("RAYPOD_SSO_CLIENT_SECRET", "")
        if not client_id or not secret:
            raise errors.InvalidSpec(
                "RAYPOD_SSO_ISSUER needs RAYPOD_SSO_CLIENT_ID and RAYPOD_SSO_CLIENT_SECRET_FILE (a file of mode 0600)"
            )
        return cls(
            issuer=issuer.rstrip("/"),
            client_id=client_id,
            client_secret=secret,
            redirect_url=os.environ.get("RAYPOD_SSO_REDIRECT_URL") or None,
            scopes=os.environ.get("RAYPOD_SSO_SCOPES") or cls.scopes,
            username_claim=os.environ.get("RAYPOD_SSO_USERNAME_CLAIM") or cls.username_claim,
            groups_claim=os.environ.get("RAYPOD_SSO_GROUPS_CLAIM") or cls.groups_claim,
            groups=group_grants(_json_env("RAYPOD_SSO_GROUPS")),
            session_ttl=timedelta(seconds=_float_env("RAYPOD_SSO_SESSION_TTL_S", 8 * 3600)),
            token_ttl=timedelta(seconds=_float_env("RAYPOD_SSO_TOKEN_TTL_S", 3600)),
            leeway_s=int(_float_env("RAYPOD_SSO_LEEWAY_S", 60)),
            display_name=os.environ.get("RAYPOD_SSO_NAME") or cls.display_name,
        )


def group_grants(raw: dict[str, Any]) -> dict[str, tuple[GroupGrant, ...]]:
    """``{"ml-engineers": {"team": "ml"}, "ml-leads": {"team": "ml", "role": "admin"},
    "platform": {"installation_admin": true}}``; a group may give a list of such grants.

    Raises:
        InvalidSpec: naming the group whose grant is wrong."""
    found: dict[str, tuple[GroupGrant, ...]] = {}
    for group, value in raw.items():
        grants = value if isinstance(value, list) else [value]
        parsed = []
        for grant in grants:
            keys = set(grant) if isinstance(grant, dict) else set()
            ok = isinstance(grant, dict) and keys <= {"team", "role", "installation_admin"}
            team, role = (grant.get("team"), grant.get("role", "member")) if ok else (None, "member")
            admin = bool(grant.get("installation_admin")) if ok else False
            if (
                not ok
                or role not in ("member", "admin")
                or (team is None) == (not admin)
                or (team is not None and not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", str(team)))
            ):
                raise errors.InvalidSpec(
                    f'RAYPOD_SSO_GROUPS: group \'{group}\' must give {{"team": NAME, "role": "member"|"admin"}} '
                    'or {"installation_admin": true}'
                )
            parsed.append(GroupGrant(team=team, role=role, installation_admin=admin))
        found[str(group)] = tuple(parsed)
    return found


@dataclass(frozen=True)
class Settings:
    """Everything the server needs; every field has an environment variable (see docs/configuration.md)."""

    home: Path = field(default_factory=default_home)
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    database_url: str | None = None
    backend: str = "local"
    reconcile_interval_s: float = 1.0
    drain_timeout_s: float = 30.0
    node_start_timeout_s: float = 180.0
    gcs_unreachable_timeout_s: float = 60.0
    # How far past its own end a browser session may let a token it creates live.
    session_token_max_ttl: timedelta = timedelta(days=1)
    # The gateway: how long an upstream dashboard may be silent, and how many requests one user may have in
    # flight to one cluster.
    gateway_connect_timeout_s: float = 10.0
    gateway_read_timeout_s: float = 120.0
    gateway_max_in_flight: int = 32
    # Websockets through the gateway: pinged this often to keep idle paths open; never closed for a late pong.
    ws_ping_interval_s: float = 30.0
    max_json_body_bytes: int = 2**20
    max_upload_bytes: int = 100 * 2**20
    # What one request through the gateway may carry (a working dir's package on its way to Ray, a notebook).
    gateway_max_body_bytes: int = 512 * 2**20
    # Proxied pages' own origins: <name>--<namespace>.<origin_domain> (a wildcard DNS name pointing at raypod;
    # "localhost" on a laptop, whose subdomains browsers resolve to loopback).
    origin_domain: str = "localhost"
    # Local backend: "auto" runs nodes in their own mount and PID namespaces when the host allows it; "off" never.
    isolation: str = "auto"
    # Local backend: names of the server's environment variables that nodes inherit beyond the fixed allow-list
    # (PATH, HOME, LANG, LC_*, TZ, TMPDIR...): an operator's choice, e.g. a proxy for every cluster.
    node_env_passthrough: tuple[str, ...] = ()
    # What the server may fetch or post to for users (catalog sources, hang webhooks): public addresses, and these
    # hosts and networks besides (RAYPOD_OUTBOUND_ALLOW, comma-separated: names, addresses, CIDRs).
    outbound: outbound_mod.Policy = field(default_factory=outbound_mod.Policy)
    fast_health_checks: bool = True
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_ca: Path | None = None  # the CA clients should trust (raypod's local CA for its own certificate)
    tls: bool = True
    # Governance: priority classes by name (higher runs first and may preempt), and the pool admission fills (None:
    # what the backend says its machines hold; CPUs are Ray's logical ones, unlimited unless set).
    priority_classes: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_PRIORITY_CLASSES))
    # Which teams may use each class above "normal" (RAYPOD_PRIORITY_TEAMS="high=ops,ml;urgent=ops"); others may
    # not (installation admins may use any).
    priority_teams: dict[str, tuple[str, ...]] = field(default_factory=dict)
    pool_cpus: float | None = None
    pool_memory: int | None = None
    pool_gpus: int | None = None
    # Kubernetes with Kueue: RayClusters and RayJobs carry Kueue's labels and Kueue admits them; raypod's own
    # admission steps aside (its quotas are exported as Kueue objects: raypod quota kueue).
    kueue: bool = False
    # Where nodes reach the server (a pod's agent reports there; RAYPOD_NODE_URL): the in-cluster Service on
    # Kubernetes. Unset: ``public_url``.
    node_url: str | None = None
    # Object storage (an fsspec URL, RAYPOD_MODEL_STAGING_URL; its options as JSON without secrets in
    # RAYPOD_MODEL_STAGING_OPTIONS) where a model read from the server's own disk is copied for nodes that cannot
    # read that disk (Kubernetes' pods). Unset: such a model is refused on those clusters.
    model_staging_url: str | None = None
    model_staging_options: dict[str, Any] = field(default_factory=dict)
    # Where jobs' logs and records and deleted clusters' events are archived (RAYPOD_HISTORY_URL: any fsspec URL,
    # options in RAYPOD_HISTORY_OPTIONS; default <home>/history), and for how long (RAYPOD_HISTORY_RETENTION_DAYS).
    history_url: str | None = None
    history_options: dict[str, Any] = field(default_factory=dict)
    history_retention_days: float = 30.0
    history_max_log_bytes: int = (
        16 * 2**20
    )  # an attempt's archived log (RAYPOD_HISTORY_MAX_LOG_BYTES): its start and end
    # Single sign-on with the organisation's OpenID Connect provider (RAYPOD_SSO_*; None: tokens only).
    sso: SsoSettings | None = None

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        values: dict[str, object] = {
            "home": default_home(),
            "database_url": os.environ.get("RAYPOD_DATABASE_URL") or None,
            "backend": os.environ.get("RAYPOD_BACKEND", "local"),
            "reconcile_interval_s": _float_env("RAYPOD_RECONCILE_INTERVAL_S", 1.0),
            "drain_timeout_s": _float_env("RAYPOD_DRAIN_TIMEOUT_S", 30.0),
            "node_start_timeout_s": _float_env("RAYPOD_NODE_START_TIMEOUT_S", 180.0),
            "gcs_unreachable_timeout_s": _float_env("RAYPOD_GCS_UNREACHABLE_TIMEOUT_S", 60.0),
            "session_token_max_ttl": timedelta(seconds=_float_env("RAYPOD_SESSION_TOKEN_MAX_TTL_S", 86400.0)),
            "gateway_connect_timeout_s": _float_env("RAYPOD_GATEWAY_CONNECT_TIMEOUT_S", 10.0),
            "gateway_read_timeout_s": _float_env("RAYPOD_GATEWAY_READ_TIMEOUT_S", 120.0),
            "gateway_max_in_flight": int(_float_env("RAYPOD_GATEWAY_MAX_IN_FLIGHT", 32)),
            "ws_ping_interval_s": _float_env("RAYPOD_WS_PING_INTERVAL_S", 30.0),
            "max_json_body_bytes": int(_float_env("RAYPOD_MAX_JSON_BODY_BYTES", 2**20)),
            "max_upload_bytes": int(_float_env("RAYPOD_MAX_UPLOAD_BYTES", 100 * 2**20)),
            "gateway_max_body_bytes": int(_float_env("RAYPOD_GATEWAY_MAX_BODY_BYTES", 512 * 2**20)),
            "origin_domain": os.environ.get("RAYPOD_ORIGIN_DOMAIN") or "localhost",
            "isolation": _choice_env("RAYPOD_ISOLATION", ("auto", "off"), "auto"),
            "node_env_passthrough": _names_env("RAYPOD_NODE_ENV_PASSTHROUGH"),
            "outbound": outbound_mod.Policy.from_env(),
            "priority_classes": _priority_classes(os.environ.get("RAYPOD_PRIORITY_CLASSES")),
            "priority_teams": _priority_teams(os.environ.get("RAYPOD_PRIORITY_TEAMS")),
            "pool_cpus": _optional_float_env("RAYPOD_POOL_CPUS"),
            "pool_memory": _optional_int(_optional_float_env("RAYPOD_POOL_MEMORY")),
            "pool_gpus": _optional_int(_optional_float_env("RAYPOD_POOL_GPUS")),
            "kueue": _choice_env("RAYPOD_KUEUE", ("0", "1"), "0") == "1",
            "node_url": os.environ.get("RAYPOD_NODE_URL") or None,
            "model_staging_url": os.environ.get("RAYPOD_MODEL_STAGING_URL") or None,
            "model_staging_options": _json_env("RAYPOD_MODEL_STAGING_OPTIONS"),
            "history_url": os.environ.get("RAYPOD_HISTORY_URL") or None,
            "history_options": _json_env("RAYPOD_HISTORY_OPTIONS"),
            "history_retention_days": _float_env("RAYPOD_HISTORY_RETENTION_DAYS", 30.0),
            "history_max_log_bytes": _at_least("RAYPOD_HISTORY_MAX_LOG_BYTES", 16 * 2**20, 4096),
            "sso": SsoSettings.from_env(),
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]

    @property
    def public_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home / 'raypod.db'}"


PROMETHEUS_PASSWORD_FILE = "prometheus-password"


def monitoring_dir(home: Path) -> Path:
    return home / "monitoring"


@dataclass(frozen=True)
class MonitoringEndpoints:
    """Where Prometheus (and, optionally, Grafana) answer, written by ``raypod monitoring up``; the environment
    (``RAYPOD_PROMETHEUS_URL``, ``RAYPOD_GRAFANA_URL``) overrides the file."""

    prometheus_url: str | None = None
    grafana_url: str | None = None
    # Basic auth for Prometheus' API: the one `raypod monitoring up` made (0600 beside it), or the environment's
    # RAYPOD_PROMETHEUS_USER/RAYPOD_PROMETHEUS_PASSWORD for an operator's own Prometheus. Never given to nodes.
    prometheus_auth: tuple[str, str] | None = None

    @classmethod
    def read(cls, home: Path) -> MonitoringEndpoints:
        try:
            data = json.loads((monitoring_dir(home) / "endpoints.json").read_text())
        except (OSError, ValueError):
            data = {}
        if not isinstance(data, dict):
            data = {}
        auth = None
        if os.environ.get("RAYPOD_PROMETHEUS_PASSWORD"):
            auth = (os.environ.get("RAYPOD_PROMETHEUS_USER", "raypod"), os.environ["RAYPOD_PROMETHEUS_PASSWORD"])
        else:
            try:
                auth = ("raypod", (monitoring_dir(home) / PROMETHEUS_PASSWORD_FILE).read_text().strip())
            except OSError:
                auth = None
        return cls(
            prometheus_url=os.environ.get("RAYPOD_PROMETHEUS_URL") or data.get("prometheus_url") or None,
            grafana_url=os.environ.get("RAYPOD_GRAFANA_URL") or data.get("grafana_url") or None,
            prometheus_auth=auth,
        )

    def ray_dashboard_env(self) -> dict[str, str]:
        """The variables that make a Ray head's dashboard draw its metrics views from this Prometheus/Grafana."""
        env: dict[str, str] = {}
        if self.prometheus_url:
            env["RAY_PROMETHEUS_HOST"] = self.prometheus_url
            env["RAY_PROMETHEUS_NAME"] = "Prometheus"
        if self.grafana_url:
            env["RAY_GRAFANA_HOST"] = self.grafana_url
            env["RAY_GRAFANA_IFRAME_HOST"] = self.grafana_url
        return env
