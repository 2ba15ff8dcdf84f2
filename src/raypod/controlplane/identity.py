"""Users, teams, namespaces, API tokens and sessions, and the pure authorization rules over them.

Token secrets are shown once and stored only as SHA-256 hashes (they are 256-bit random, so a fast hash is
enough); a token is ``rpt_<id>_<secret>`` so it can be looked up without scanning.
"""

from __future__ import annotations

import builtins
import hashlib
import hmac
import secrets
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum
from pathlib import Path

from raypod import config, errors, state
from raypod import spec as spec_mod
from raypod.controlplane import store
from raypod.controlplane.store.identities import IdentityStore

BOOTSTRAP_USER = "admin"
DEFAULT_TEAM = "default"
DEFAULT_NAMESPACE = "default"
SESSION_TTL = timedelta(hours=12)
MAX_TOKEN_TTL = timedelta(days=366)


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
    teams: dict[str, state.Role] = field(default_factory=dict)
    session_csrf: str | None = None  # set when the caller is a browser session
    token_id: str | None = None  # the API token the caller presented, or its session was made from
    token_expires_at: datetime | None = None  # for a session: when the session ends

    @property
    def via_session(self) -> bool:
        return self.session_csrf is not None


def authorize(
    principal: Principal, verb: Verb, namespace: str, namespace_team: str | None, owner: str | None = None
) -> None:
    """Allow or refuse; pure. Team members view and create; the owner or team admins operate.

    Raises:
        Forbidden: with a message that says who may.
    """
    if principal.is_admin:
        return
    role = principal.teams.get(namespace_team) if namespace_team is not None else None
    if role is None:
        # One answer for a namespace that does not exist and one of a team the caller is not in: neither its
        # existence nor its team is told to outsiders.
        raise errors.Forbidden(
            f"user '{principal.user}' may not {verb.value} namespace '{namespace}': it does not exist, or you are "
            "not a member of its team"
        )
    if verb in (Verb.VIEW, Verb.CREATE) and role is not None:
        return
    if verb is Verb.OPERATE and (role is state.Role.ADMIN or (owner is not None and owner == principal.user)):
        return
    if verb is Verb.OPERATE:
        who = f"the cluster owner ({owner})" if owner else "the cluster owner"
        raise errors.Forbidden(
            f"user '{principal.user}' may not operate clusters in namespace '{namespace}': "
            f"only {who} or admins of team '{namespace_team}' may submit or stop jobs, scale or delete"
        )
    raise errors.Forbidden(f"user '{principal.user}' may not {verb.value} namespace '{namespace}'")


def authorize_hidden(
    principal: Principal, verb: Verb, namespace: str, namespace_team: str | None, owner: str | None, not_found: str
) -> None:
    """``authorize`` for a thing outsiders may not learn exists: a caller who may not view its namespace gets
    ``NotFound(not_found)``, the answer for one that does not exist; pure.

    Raises:
        NotFound, Forbidden (may view, may not ``verb``)."""
    if not principal.is_admin and (namespace_team is None or namespace_team not in principal.teams):
        raise errors.NotFound(not_found)
    authorize(principal, verb, namespace, namespace_team, owner)


def require_admin(principal: Principal, what: str) -> None:
    """Raises Forbidden unless ``principal`` is an installation admin."""
    if not principal.is_admin:
        raise errors.Forbidden(f"only admins may {what}")


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


TOKEN_PREFIX = "rpt"
CACHE_TTL_S = 5.0


def parse_token(presented: str) -> tuple[str, str]:
    """Split ``rpt_<id>_<secret>``; the one parser of presented tokens.

    Raises:
        Unauthenticated: not of that form.
    """
    parts = presented.strip().split("_", 2)
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX or not parts[1] or not parts[2] or len(presented) > 256:
        raise errors.Unauthenticated("malformed token; create one with 'raypod token create'")
    return parts[1], parts[2]


class TokenCache:
    """Principals of tokens authenticated a moment ago, so a proxied request costs no database read.

    Entries end at the token's expiry; every change to tokens, users or memberships clears the cache, so
    revocation and role changes take effect at once on this server.
    """

    def __init__(self, ttl_s: float = CACHE_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._entries: dict[str, tuple[float, Principal, float | None]] = {}
        self._lock = threading.Lock()

    def get(self, token: str) -> Principal | None:
        with self._lock:
            entry = self._entries.get(token)
        if entry is None:
            return None
        cached_at, principal, expires_at = entry
        now = time.time()
        if now - cached_at > self.ttl_s or (expires_at is not None and now >= expires_at):
            return None
        return principal

    def put(self, token: str, principal: Principal, expires_at: float | None) -> None:
        with self._lock:
            if len(self._entries) > 10_000:
                self._entries.clear()
            self._entries[token] = (time.time(), principal, expires_at)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


class IdentityService:
    def __init__(self, db: store.Store) -> None:
        self.records = IdentityStore(db.engine)
        self.cache = TokenCache()

    # -- bootstrap -----------------------------------------------------------------------------------------

    def bootstrap(self, credentials_path: Path, server_url: str, ca_file: Path | None) -> bool:
        """On first start: an admin user, the default team and namespace, and an admin token written to
        ``credentials_path`` with mode 0600. Returns whether it did anything."""
        if self.records.any_user():
            return False
        self.create_user(BOOTSTRAP_USER, is_admin=True)
        self.create_team(DEFAULT_TEAM)
        self.add_member(DEFAULT_TEAM, BOOTSTRAP_USER, state.Role.ADMIN)
        self.create_namespace(DEFAULT_NAMESPACE, DEFAULT_TEAM)
        created = self.create_token(BOOTSTRAP_USER, "bootstrap", ttl=None)
        config.write_credentials(credentials_path, server_url, created.token, ca_file)
        return True

    # -- users, teams, namespaces --------------------------------------------------------------------------

    # Each verb the API calls takes its caller as ``by`` and checks it; the server's own calls (the first start,
    # tests) leave it out.

    def create_user(
        self,
        name: str,
        is_admin: bool = False,
        *,
        by: Principal | None = None,
        team: str | None = None,
        role: state.Role = state.Role.MEMBER,
    ) -> state.UserInfo:
        """A user, member of ``team`` with ``role`` if one is given. Admins only."""
        if by is not None:
            require_admin(by, "create users")
        _check_name(name, "user name")
        self.records.insert_user(name, is_admin)
        if team:
            self.add_member(team, name, role)
        return self.user(name)

    def user(self, name: str) -> state.UserInfo:
        found = self.records.user(name)
        if found is None:
            raise errors.NotFound(f"user '{name}' not found")
        return found

    def delete_user(self, name: str) -> None:
        """Remove a user: its tokens are revoked, its sessions end and its memberships go, at once (the cache
        included). What it created stays: the caller decides about that. Raises NotFound, Conflict (the last
        admin)."""
        info = self.user(name)
        self.records.delete_user(name, is_admin=info.is_admin)
        self.cache.clear()

    def list_users(self, *, by: Principal | None = None) -> builtins.list[state.UserInfo]:
        if by is not None:
            require_admin(by, "list users")
        return [self.user(name) for name in self.records.user_names()]

    def create_team(self, name: str, *, by: Principal | None = None) -> None:
        if by is not None:
            require_admin(by, "create teams")
        _check_name(name, "team name")
        self.records.insert_team(name)

    def list_teams(self) -> builtins.list[str]:
        return self.records.team_names()

    def team_exists(self, team: str) -> bool:
        return self.records.team_exists(team)

    def add_member(self, team: str, user: str, role: state.Role, *, by: Principal | None = None) -> state.UserInfo:
        """Admins, and admins of the team."""
        if by is not None and not by.is_admin and by.teams.get(team) is not state.Role.ADMIN:
            raise errors.Forbidden(f"only admins or admins of team '{team}' may add members")
        self.user(user)
        self._require_team(team)
        self.records.set_membership(team, user, role)
        self.cache.clear()
        return self.user(user)

    def create_namespace(self, name: str, team: str, *, by: Principal | None = None) -> state.NamespaceInfo:
        if by is not None:
            require_admin(by, "create namespaces")
        _check_name(name, "namespace")
        self._require_team(team)
        self.records.insert_namespace(name, team)
        return state.NamespaceInfo(name=name, team=team)

    def namespace_team(self, name: str) -> str | None:
        return self.records.namespace_team(name)

    def list_namespaces(self, *, by: Principal | None = None) -> builtins.list[state.NamespaceInfo]:
        """Every namespace, or those of ``by``'s teams (admins see all)."""
        found = self.records.namespaces()
        return found if by is None or by.is_admin else [ns for ns in found if ns.team in by.teams]

    # -- tokens --------------------------------------------------------------------------------------------

    def create_token(
        self,
        user: str,
        name: str,
        ttl: timedelta | None,
        *,
        not_after: datetime | None = None,
        parent: str | None = None,
    ) -> state.CreatedToken:
        """A new token of ``user``; with ``parent`` (the token the request came with, or its session's), it
        expires no later than that token and is revoked with it, so a stolen credential never turns into a
        longer-lived one.

        Raises:
            NotFound (user), InvalidSpec (ttl out of range, past ``not_after`` or past its parent's expiry).
        """
        self.user(user)
        if ttl is not None and not timedelta(0) < ttl <= MAX_TOKEN_TTL:
            raise errors.InvalidSpec(f"token lifetime must be between 1 second and {MAX_TOKEN_TTL.days} days")
        created = store.now()
        expires_at = created + ttl if ttl else None
        if not_after is not None and (expires_at is None or expires_at > not_after):
            raise errors.InvalidSpec(
                f"a browser session may create tokens that expire by {not_after:%Y-%m-%d %H:%M} UTC at the latest; "
                "ask for a shorter lifetime, or use an API token"
            )
        if parent is not None:
            made_with = self.token(parent)
            if made_with.expires_at is not None and (expires_at is None or expires_at > made_with.expires_at):
                raise errors.InvalidSpec(
                    f"a token made with token {made_with.id} expires by {made_with.expires_at:%Y-%m-%d %H:%M} UTC "
                    "at the latest (when that one does); ask for a shorter lifetime"
                )
        token_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
        row = {
            "id": token_id,
            "user": user,
            "name": name[:63],
            "secret_hash": _hash(secret),
            "created_at": created,
            "expires_at": expires_at,
            "revoked_at": None,
            "parent_id": parent,
        }
        self.records.insert_token(row)
        info = {k: v for k, v in row.items() if k not in ("secret_hash", "parent_id")} | {"parent": parent}
        return state.CreatedToken(**info, token=f"{TOKEN_PREFIX}_{token_id}_{secret}")

    def list_tokens(self, user: str | None = None, *, by: Principal | None = None) -> builtins.list[state.TokenInfo]:
        """``user``'s tokens (all of them: None); ``by`` sees its own, an admin every one."""
        if by is not None:
            user = None if by.is_admin else by.user
        return self.records.tokens(user)

    def issue_token(
        self,
        by: Principal,
        user: str | None,
        name: str,
        ttl: timedelta | None,
        *,
        ttl_asked: bool,
        session_max_ttl: timedelta,
    ) -> state.CreatedToken:
        """A token ``by`` asked for, for itself or (admins) for ``user``. A browser session may not mint a token
        that lives longer than ``session_max_ttl`` (a stolen cookie must not turn into a year-long credential); a
        token made with a token (or a session's) never outlives it and dies with it. An admin's token for another
        user is that user's own, not a child of the admin's. The default lifetime (``ttl_asked`` false) ends with
        what bounds it rather than being refused."""
        user = user or by.user
        if user != by.user:
            require_admin(by, "create tokens for other users")
        not_after = store.now() + session_max_ttl if by.via_session else None
        parent = by.token_id if user == by.user else None
        if not ttl_asked and ttl is not None:
            bounds = [not_after, by.token_expires_at if parent else None]
            ends = min((b for b in bounds if b is not None), default=None)
            if ends is not None:
                ttl = max(timedelta(seconds=1), min(ttl, ends - store.now() - timedelta(seconds=1)))
        return self.create_token(user, name, ttl, not_after=not_after, parent=parent)

    def token(self, token_id: str) -> state.TokenInfo:
        found = self.records.token(token_id)
        if found is None:
            raise errors.NotFound(f"token '{token_id[:16]}' not found")
        return found

    def revoke_token(self, token_id: str, *, by: Principal | None = None) -> state.TokenInfo:
        """Revoke a token, every token made with it (and with those, down the line), and end every browser
        session made from any of them, at once (the cache included). ``by`` revokes its own; admins any."""
        found = self.token(token_id)
        if by is not None and found.user != by.user and not by.is_admin:
            raise errors.NotFound(f"token '{token_id[:16]}' not found")  # as one that does not exist
        self.records.revoke_lineage(found.id)
        self.cache.clear()
        return self.token(found.id)

    def cached_principal(self, presented: str) -> Principal | None:
        """The principal of a token authenticated a moment ago, without touching the database (or None)."""
        return self.cache.get(presented)

    def authenticate_token(self, presented: str) -> Principal:
        """The one way a presented token becomes a principal: parsing, the cache, hash, revocation and expiry.

        Raises:
            Unauthenticated: anything but a known, unexpired, unrevoked token.
        """
        cached = self.cache.get(presented)
        if cached is not None:
            return cached
        token_id, secret = parse_token(presented)
        found = self.records.token_secret(token_id)
        if found is None or not hmac.compare_digest(found[1], _hash(secret)):
            raise errors.Unauthenticated("unknown token")
        info = found[0]
        if info.revoked_at is not None:
            raise errors.Unauthenticated("token was revoked")
        if info.expires_at is not None and info.expires_at <= store.now():
            raise errors.Unauthenticated("token expired; create a new one with 'raypod token create'")
        principal = replace(self.principal(info.user), token_id=token_id, token_expires_at=info.expires_at)
        self.cache.put(presented, principal, info.expires_at.timestamp() if info.expires_at else None)
        return principal

    def principal(self, user: str) -> Principal:
        info = self.user(user)
        return Principal(user=info.name, is_admin=info.is_admin, teams=dict(info.teams))

    # -- browser sessions ----------------------------------------------------------------------------------

    def create_session(self, principal: Principal) -> tuple[str, str]:
        """Return (session id for the cookie, CSRF token for the page); only a hash of the id is stored.

        The session is bound to the token it was made from: it ends when that token is revoked or expires.
        """
        session_id, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(24)
        expires_at = store.now() + SESSION_TTL
        if principal.token_expires_at is not None:
            expires_at = min(expires_at, principal.token_expires_at)
        self.records.insert_session(_hash(session_id), principal.user, csrf, expires_at, principal.token_id)
        return session_id, csrf

    def authenticate_session(self, session_id: str) -> Principal:
        """Raises Unauthenticated for an unknown or expired session, or one whose token was revoked."""
        return self.authenticate_session_hash(session_hash(session_id))

    def authenticate_session_hash(self, id_hash: str) -> Principal:
        """A session named by its stored hash (what a proxied origin's cookie carries, never the session id).

        Raises:
            Unauthenticated: as ``authenticate_session``."""
        found = self.records.session(id_hash)
        now = store.now()
        if found is None or found.token_id is None or found.expires_at <= now:
            raise errors.Unauthenticated("session expired; log in again")
        token_expired = found.token_expires_at is not None and found.token_expires_at <= now
        if found.token_revoked or token_expired:
            self.records.delete_session(id_hash)
            raise errors.Unauthenticated("the token this session was made from was revoked or expired; log in again")
        principal = self.principal(found.user)
        return replace(principal, session_csrf=found.csrf, token_id=found.token_id, token_expires_at=found.expires_at)

    def end_session(self, session_id: str) -> None:
        self.records.delete_session(_hash(session_id[:128]))

    def _require_team(self, team: str) -> None:
        if not self.records.team_exists(team):
            raise errors.NotFound(f"team '{team}' not found")


def session_hash(session_id: str) -> str:
    """What is stored of a session id (and what names a session beyond its cookie)."""
    return _hash(session_id[:128])


def _check_name(value: str, what: str) -> None:
    if not spec_mod.is_dns_label(value):
        raise errors.InvalidSpec(f"{what} '{value}' must be a DNS-1123 label (lowercase letters, digits, '-')")
