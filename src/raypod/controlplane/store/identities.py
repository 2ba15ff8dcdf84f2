"""How users, teams, namespaces, API tokens and browser sessions are stored (tables in ``store/schema.py``).

Only hashes of secrets reach these tables; the rules over them (who may do what, lifetimes, lineage) are the
identity service's (``controlplane/identity.py``)."""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from raypod import errors, state
from raypod.controlplane.store import aware, now
from raypod.controlplane.store.schema import memberships, namespaces, sessions, teams, tokens, users


class IdentityStore:
    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine

    # -- users, teams, namespaces --------------------------------------------------------------------------

    def any_user(self) -> bool:
        with self.engine.connect() as connection:
            return bool(connection.execute(sa.select(sa.func.count()).select_from(users)).scalar())

    def insert_user(self, name: str, is_admin: bool) -> None:
        self._insert(users, {"name": name, "is_admin": is_admin, "created_at": now()}, f"user '{name}'")

    def user(self, name: str) -> state.UserInfo | None:
        with self.engine.connect() as connection:
            row = connection.execute(users.select().where(users.c.name == name)).first()
            if row is None:
                return None
            roles = {
                m.team: state.Role(m.role)
                for m in connection.execute(memberships.select().where(memberships.c.user == name))
            }
        return state.UserInfo(name=row.name, is_admin=row.is_admin, teams=roles)

    def delete_user(self, name: str, *, is_admin: bool) -> None:
        """Revoke its tokens, end its sessions, drop its memberships and the user, in one transaction.

        Raises:
            Conflict: it is the last admin.
        """
        with self.engine.begin() as connection:
            if is_admin:
                admins = connection.execute(sa.select(sa.func.count()).select_from(users).where(users.c.is_admin))
                if admins.scalar() == 1:
                    raise errors.Conflict(f"user '{name}' is the last admin; make another admin first")
            connection.execute(
                tokens.update().where(tokens.c.user == name, tokens.c.revoked_at.is_(None)).values(revoked_at=now())
            )
            connection.execute(sessions.delete().where(sessions.c.user == name))
            connection.execute(memberships.delete().where(memberships.c.user == name))
            connection.execute(users.delete().where(users.c.name == name))

    def user_names(self) -> builtins.list[str]:
        with self.engine.connect() as connection:
            return list(connection.execute(sa.select(users.c.name).order_by(users.c.name)).scalars().all())

    def insert_team(self, name: str) -> None:
        self._insert(teams, {"name": name, "created_at": now()}, f"team '{name}'")

    def team_names(self) -> builtins.list[str]:
        with self.engine.connect() as connection:
            return list(connection.execute(sa.select(teams.c.name).order_by(teams.c.name)).scalars().all())

    def team_exists(self, team: str) -> bool:
        with self.engine.connect() as connection:
            return connection.execute(sa.select(teams.c.name).where(teams.c.name == team)).first() is not None

    def set_membership(self, team: str, user: str, role: state.Role) -> None:
        with self.engine.begin() as connection:
            connection.execute(memberships.delete().where(memberships.c.team == team, memberships.c.user == user))
            connection.execute(memberships.insert().values(team=team, user=user, role=role.value))

    def insert_namespace(self, name: str, team: str) -> None:
        self._insert(namespaces, {"name": name, "team": team}, f"namespace '{name}'")

    def namespace_team(self, name: str) -> str | None:
        with self.engine.connect() as connection:
            team: str | None = connection.execute(
                sa.select(namespaces.c.team).where(namespaces.c.name == name)
            ).scalar()
        return team

    def namespaces(self) -> builtins.list[state.NamespaceInfo]:
        with self.engine.connect() as connection:
            rows = connection.execute(namespaces.select().order_by(namespaces.c.name)).all()
        return [state.NamespaceInfo(name=row.name, team=row.team) for row in rows]

    # -- tokens --------------------------------------------------------------------------------------------

    def insert_token(self, row: dict[str, Any]) -> None:
        with self.engine.begin() as connection:
            connection.execute(tokens.insert().values(**row))

    def tokens(self, user: str | None = None) -> builtins.list[state.TokenInfo]:
        query = tokens.select().order_by(tokens.c.created_at)
        if user is not None:
            query = query.where(tokens.c.user == user)
        with self.engine.connect() as connection:
            return [_token_info(row) for row in connection.execute(query)]

    def token(self, token_id: str) -> state.TokenInfo | None:
        row = self._token_row(token_id)
        return None if row is None else _token_info(row)

    def token_secret(self, token_id: str) -> tuple[state.TokenInfo, str] | None:
        """A token and the hash of its secret, to compare with a presented one."""
        row = self._token_row(token_id)
        return None if row is None else (_token_info(row), str(row.secret_hash))

    def revoke_lineage(self, token_id: str) -> None:
        """Revoke a token and every token made with it (down the line), and end their browser sessions."""
        with self.engine.begin() as connection:
            lineage, frontier = {token_id}, {token_id}
            while frontier:
                children = connection.execute(sa.select(tokens.c.id).where(tokens.c.parent_id.in_(frontier)))
                frontier = set(children.scalars()) - lineage
                lineage |= frontier
            connection.execute(
                tokens.update().where(tokens.c.id.in_(lineage), tokens.c.revoked_at.is_(None)).values(revoked_at=now())
            )
            connection.execute(sessions.delete().where(sessions.c.token_id.in_(lineage)))

    def _token_row(self, token_id: str) -> sa.Row[tuple[object, ...]] | None:
        with self.engine.connect() as connection:
            return connection.execute(tokens.select().where(tokens.c.id == token_id[:16])).first()

    # -- browser sessions ----------------------------------------------------------------------------------

    def insert_session(self, id_hash: str, user: str, csrf: str, expires_at: datetime, token_id: str | None) -> None:
        with self.engine.begin() as connection:
            connection.execute(
                sessions.insert().values(
                    id_hash=id_hash, user=user, csrf=csrf, expires_at=expires_at, token_id=token_id
                )
            )

    def session(self, id_hash: str) -> StoredSession | None:
        query = sa.select(sessions, tokens.c.revoked_at, tokens.c.expires_at.label("token_expires_at")).select_from(
            sessions.outerjoin(tokens, tokens.c.id == sessions.c.token_id)
        )
        with self.engine.connect() as connection:
            row = connection.execute(query.where(sessions.c.id_hash == id_hash[:64])).first()
        if row is None:
            return None
        return StoredSession(
            user=row.user,
            csrf=row.csrf,
            token_id=row.token_id,
            expires_at=aware(row.expires_at),
            token_revoked=row.revoked_at is not None,
            token_expires_at=aware(row.token_expires_at) if row.token_expires_at is not None else None,
        )

    def delete_session(self, id_hash: str) -> None:
        with self.engine.begin() as connection:
            connection.execute(sessions.delete().where(sessions.c.id_hash == id_hash[:64]))

    def _insert(self, table: sa.Table, row: dict[str, object], what: str) -> None:
        try:
            with self.engine.begin() as connection:
                connection.execute(table.insert().values(**row))
        except sa.exc.IntegrityError:
            raise errors.AlreadyExists(f"{what} already exists") from None


@dataclass(frozen=True)
class StoredSession:
    """A browser session as stored, with what the token it was made from says."""

    user: str
    csrf: str
    token_id: str | None
    expires_at: datetime
    token_revoked: bool
    token_expires_at: datetime | None


def _token_info(row: sa.Row[tuple[object, ...]]) -> state.TokenInfo:
    m = row._mapping
    return state.TokenInfo(
        id=m["id"],
        user=m["user"],
        name=m["name"],
        created_at=aware(m["created_at"]),
        expires_at=aware(m["expires_at"]) if m["expires_at"] else None,
        revoked_at=aware(m["revoked_at"]) if m["revoked_at"] else None,
        parent=m["parent_id"],
    )
