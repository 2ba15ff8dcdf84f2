"""Users, teams, namespaces, API tokens and sessions, and the pure authorization rules over them.

Token secrets are shown once and stored only as SHA-256 hashes (they are 256-bit random, so a fast hash is
enough); a token is ``rpt_<id>_<secret>`` so it can be looked up without scanning.
"""

from __future__ import annotations

import builtins
import hashlib
import hmac
import json
import os
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from pathlib import Path

import sqlalchemy as sa
from pydantic import BaseModel, Field

from raypod import errors
from raypod import spec as spec_mod
from raypod.controlplane import store

users = sa.Table(
    "users",
    store.metadata,
    sa.Column("name", sa.String(63), primary_key=True),
    sa.Column("is_admin", sa.Boolean, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)
teams = sa.Table(
    "teams",
    store.metadata,
    sa.Column("name", sa.String(63), primary_key=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)
memberships = sa.Table(
    "memberships",
    store.metadata,
    sa.Column("team", sa.String(63), primary_key=True),
    sa.Column("user", sa.String(63), primary_key=True),
    sa.Column("role", sa.String(16), nullable=False),
)
namespaces = sa.Table(
    "namespaces",
    store.metadata,
    sa.Column("name", sa.String(63), primary_key=True),
    sa.Column("team", sa.String(63), nullable=False),
)
tokens = sa.Table(
    "tokens",
    store.metadata,
    sa.Column("id", sa.String(16), primary_key=True),
    sa.Column("user", sa.String(63), nullable=False),
    sa.Column("name", sa.String(63), nullable=False),
    sa.Column("secret_hash", sa.String(64), nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
)
sessions = sa.Table(
    "sessions",
    store.metadata,
    sa.Column("id_hash", sa.String(64), primary_key=True),
    sa.Column("user", sa.String(63), nullable=False),
    sa.Column("csrf", sa.String(64), nullable=False),
    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
)

BOOTSTRAP_USER = "admin"
DEFAULT_TEAM = "default"
DEFAULT_NAMESPACE = "default"
SESSION_TTL = timedelta(hours=12)
MAX_TOKEN_TTL = timedelta(days=366)


class Role(StrEnum):
    ADMIN = "admin"
    MEMBER = "member"


class Verb(StrEnum):
    """What a request wants to do to a cluster; names double as words in 403 messages."""

    VIEW = "view"
    CREATE = "create clusters in"
    OPERATE = "operate"  # submit/stop jobs, scale, delete


@dataclass(frozen=True)
class Principal:
    """An authenticated user and what they belong to."""

    user: str
    is_admin: bool = False
    teams: dict[str, Role] = field(default_factory=dict)
    session_csrf: str | None = None


class TokenInfo(BaseModel):
    id: str
    user: str
    name: str
    created_at: datetime
    expires_at: datetime | None = None
    revoked_at: datetime | None = None


class CreatedToken(TokenInfo):
    token: str = Field(description="The secret: shown this once, stored only hashed.")


class UserInfo(BaseModel):
    name: str
    is_admin: bool
    teams: dict[str, Role] = Field(default_factory=dict)


class NamespaceInfo(BaseModel):
    name: str
    team: str


def authorize(
    principal: Principal, verb: Verb, namespace: str, namespace_team: str | None, owner: str | None = None
) -> None:
    """Allow or refuse; pure. Team members view and create; the owner or team admins operate.

    Raises:
        Forbidden: with a message that says who may.
    """
    if principal.is_admin:
        return
    if namespace_team is None:
        raise errors.Forbidden(f"namespace '{namespace}' does not exist; an admin can create it")
    role = principal.teams.get(namespace_team)
    if verb in (Verb.VIEW, Verb.CREATE) and role is not None:
        return
    if verb is Verb.OPERATE and (role is Role.ADMIN or (owner is not None and owner == principal.user)):
        return
    if verb is Verb.OPERATE:
        who = f"the cluster owner ({owner})" if owner else "the cluster owner"
        raise errors.Forbidden(
            f"user '{principal.user}' may not operate clusters in namespace '{namespace}': "
            f"only {who} or admins of team '{namespace_team}' may submit or stop jobs, scale or delete"
        )
    raise errors.Forbidden(
        f"user '{principal.user}' may not {verb.value} namespace '{namespace}': "
        f"only members of team '{namespace_team}' may"
    )


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class IdentityService:
    def __init__(self, db: store.Store) -> None:
        self.engine = db.engine

    # -- bootstrap -----------------------------------------------------------------------------------------

    def bootstrap(self, credentials_path: Path, server_url: str, ca_file: Path | None) -> bool:
        """On first start: an admin user, the default team and namespace, and an admin token written to
        ``credentials_path`` with mode 0600. Returns whether it did anything."""
        with self.engine.connect() as connection:
            if connection.execute(sa.select(sa.func.count()).select_from(users)).scalar():
                return False
        self.create_user(BOOTSTRAP_USER, is_admin=True)
        self.create_team(DEFAULT_TEAM)
        self.add_member(DEFAULT_TEAM, BOOTSTRAP_USER, Role.ADMIN)
        self.create_namespace(DEFAULT_NAMESPACE, DEFAULT_TEAM)
        created = self.create_token(BOOTSTRAP_USER, "bootstrap", ttl=None)
        write_credentials(credentials_path, server_url, created.token, ca_file)
        return True

    # -- users, teams, namespaces --------------------------------------------------------------------------

    def create_user(self, name: str, is_admin: bool = False) -> UserInfo:
        _check_name(name, "user name")
        self._insert(users, {"name": name, "is_admin": is_admin, "created_at": store.now()}, f"user '{name}'")
        return self.user(name)

    def user(self, name: str) -> UserInfo:
        with self.engine.connect() as connection:
            row = connection.execute(users.select().where(users.c.name == name)).first()
            if row is None:
                raise errors.NotFound(f"user '{name}' not found")
            roles = {
                m.team: Role(m.role) for m in connection.execute(memberships.select().where(memberships.c.user == name))
            }
        return UserInfo(name=row.name, is_admin=row.is_admin, teams=roles)

    def list_users(self) -> builtins.list[UserInfo]:
        with self.engine.connect() as connection:
            names = connection.execute(sa.select(users.c.name).order_by(users.c.name)).scalars().all()
        return [self.user(name) for name in names]

    def create_team(self, name: str) -> None:
        _check_name(name, "team name")
        self._insert(teams, {"name": name, "created_at": store.now()}, f"team '{name}'")

    def add_member(self, team: str, user: str, role: Role) -> None:
        self.user(user)
        self._require(teams, teams.c.name == team, f"team '{team}' not found")
        with self.engine.begin() as connection:
            connection.execute(memberships.delete().where(memberships.c.team == team, memberships.c.user == user))
            connection.execute(memberships.insert().values(team=team, user=user, role=role.value))

    def create_namespace(self, name: str, team: str) -> NamespaceInfo:
        _check_name(name, "namespace")
        self._require(teams, teams.c.name == team, f"team '{team}' not found")
        self._insert(namespaces, {"name": name, "team": team}, f"namespace '{name}'")
        return NamespaceInfo(name=name, team=team)

    def namespace_team(self, name: str) -> str | None:
        with self.engine.connect() as connection:
            team: str | None = connection.execute(
                sa.select(namespaces.c.team).where(namespaces.c.name == name)
            ).scalar()
        return team

    def list_namespaces(self) -> builtins.list[NamespaceInfo]:
        with self.engine.connect() as connection:
            rows = connection.execute(namespaces.select().order_by(namespaces.c.name)).all()
        return [NamespaceInfo(name=row.name, team=row.team) for row in rows]

    # -- tokens --------------------------------------------------------------------------------------------

    def create_token(self, user: str, name: str, ttl: timedelta | None) -> CreatedToken:
        """Raises NotFound (user), InvalidSpec (ttl out of range)."""
        self.user(user)
        if ttl is not None and not timedelta(0) < ttl <= MAX_TOKEN_TTL:
            raise errors.InvalidSpec(f"token lifetime must be between 1 second and {MAX_TOKEN_TTL.days} days")
        token_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
        created = store.now()
        row = {
            "id": token_id,
            "user": user,
            "name": name[:63],
            "secret_hash": _hash(secret),
            "created_at": created,
            "expires_at": created + ttl if ttl else None,
            "revoked_at": None,
        }
        with self.engine.begin() as connection:
            connection.execute(tokens.insert().values(**row))
        info = {k: v for k, v in row.items() if k != "secret_hash"}
        return CreatedToken(**info, token=f"rpt_{token_id}_{secret}")

    def list_tokens(self, user: str | None = None) -> builtins.list[TokenInfo]:
        query = tokens.select().order_by(tokens.c.created_at)
        if user is not None:
            query = query.where(tokens.c.user == user)
        with self.engine.connect() as connection:
            return [_token_info(row) for row in connection.execute(query)]

    def token(self, token_id: str) -> TokenInfo:
        with self.engine.connect() as connection:
            row = connection.execute(tokens.select().where(tokens.c.id == token_id)).first()
        if row is None:
            raise errors.NotFound(f"token '{token_id}' not found")
        return _token_info(row)

    def revoke_token(self, token_id: str) -> TokenInfo:
        self.token(token_id)
        with self.engine.begin() as connection:
            connection.execute(
                tokens.update()
                .where(tokens.c.id == token_id, tokens.c.revoked_at.is_(None))
                .values(revoked_at=store.now())
            )
        return self.token(token_id)

    def authenticate_token(self, presented: str) -> Principal:
        """Raises Unauthenticated for anything but a known, unexpired, unrevoked token."""
        parts = presented.split("_", 2)
        if len(parts) != 3 or parts[0] != "rpt":
            raise errors.Unauthenticated("malformed token; create one with 'raypod token create'")
        with self.engine.connect() as connection:
            row = connection.execute(tokens.select().where(tokens.c.id == parts[1])).first()
        if row is None or not hmac.compare_digest(row.secret_hash, _hash(parts[2])):
            raise errors.Unauthenticated("unknown token")
        if row.revoked_at is not None:
            raise errors.Unauthenticated("token was revoked")
        if row.expires_at is not None and store.aware(row.expires_at) <= store.now():
            raise errors.Unauthenticated("token expired; create a new one with 'raypod token create'")
        return self.principal(row.user)

    def principal(self, user: str) -> Principal:
        info = self.user(user)
        return Principal(user=info.name, is_admin=info.is_admin, teams=dict(info.teams))

    # -- browser sessions ----------------------------------------------------------------------------------

    def create_session(self, principal: Principal) -> tuple[str, str]:
        """Return (session id for the cookie, CSRF token for the page); only a hash of the id is stored."""
        session_id, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(24)
        with self.engine.begin() as connection:
            connection.execute(
                sessions.insert().values(
                    id_hash=_hash(session_id), user=principal.user, csrf=csrf, expires_at=store.now() + SESSION_TTL
                )
            )
        return session_id, csrf

    def authenticate_session(self, session_id: str) -> Principal:
        with self.engine.connect() as connection:
            row = connection.execute(sessions.select().where(sessions.c.id_hash == _hash(session_id))).first()
        if row is None or store.aware(row.expires_at) <= store.now():
            raise errors.Unauthenticated("session expired; log in again")
        principal = self.principal(row.user)
        return Principal(principal.user, principal.is_admin, principal.teams, session_csrf=row.csrf)

    def end_session(self, session_id: str) -> None:
        with self.engine.begin() as connection:
            connection.execute(sessions.delete().where(sessions.c.id_hash == _hash(session_id)))

    # -- helpers -------------------------------------------------------------------------------------------

    def _insert(self, table: sa.Table, row: dict[str, object], what: str) -> None:
        try:
            with self.engine.begin() as connection:
                connection.execute(table.insert().values(**row))
        except sa.exc.IntegrityError:
            raise errors.AlreadyExists(f"{what} already exists") from None

    def _require(self, table: sa.Table, condition: sa.ColumnElement[bool], message: str) -> None:
        with self.engine.connect() as connection:
            if connection.execute(sa.select(sa.func.count()).select_from(table).where(condition)).scalar() == 0:
                raise errors.NotFound(message)


def _token_info(row: sa.Row[tuple[object, ...]]) -> TokenInfo:
    m = row._mapping
    return TokenInfo(
        id=m["id"],
        user=m["user"],
        name=m["name"],
        created_at=store.aware(m["created_at"]),
        expires_at=store.aware(m["expires_at"]) if m["expires_at"] else None,
        revoked_at=store.aware(m["revoked_at"]) if m["revoked_at"] else None,
    )


def _check_name(value: str, what: str) -> None:
    if not spec_mod.DNS1123_LABEL.match(value) or len(value) > 63:
        raise errors.InvalidSpec(f"{what} '{value}' must be a DNS-1123 label (lowercase letters, digits, '-')")


def write_credentials(path: Path, server_url: str, token: str, ca_file: Path | None) -> None:
    """Write the CLI/SDK credentials file, readable by its owner only (0600) from its first byte."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"server": server_url, "token": token, "ca_file": str(ca_file) if ca_file else None}
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        json.dump(data, handle, indent=2)
    os.chmod(path, 0o600)
