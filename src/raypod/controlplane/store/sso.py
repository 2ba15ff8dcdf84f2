"""How single sign-on is stored (tables in ``store/schema.py``); the protocol and the rules are
``controlplane/sso.py``'s."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import sqlalchemy as sa

from raypod import errors, state
from raypod.controlplane.store import aware, now
from raypod.controlplane.store.schema import memberships, sso_accounts, sso_pending, sso_tokens, teams, users

PENDING_TTL = timedelta(minutes=10)


@dataclass(frozen=True)
class PendingLogin:
    binding_hash: str
    nonce: str
    code_verifier: str
    next_url: str


class SsoStore:
    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine

    # -- accounts ----------------------------------------------------------------------------------------------

    def account_user(self, issuer: str, subject: str) -> str | None:
        with self.engine.connect() as connection:
            found: str | None = connection.execute(
                sa.select(sso_accounts.c.user).where(sso_accounts.c.issuer == issuer, sso_accounts.c.subject == subject)
            ).scalar()
        return found

    def sign_in(
        self,
        issuer: str,
        subject: str,
        user: str,
        *,
        is_admin: bool | None,
        roles: dict[str, state.Role],
        managed_teams: set[str],
    ) -> None:
        """In one transaction: create the user and bind it to the identity on its first login (refused when the
        name belongs to a local user or to another identity), then set what the provider's groups say: admin (None:
        the mapping says nothing of it) and the roles in ``managed_teams`` (made when missing; teams the mapping
        does not name are left as admins set them).

        Raises:
            Conflict: the user name is taken."""
        stamp = now()
        with self.engine.begin() as connection:
            bound = connection.execute(
                sa.select(sso_accounts.c.issuer, sso_accounts.c.subject).where(sso_accounts.c.user == user)
            ).first()
            if bound is not None and (bound.issuer, bound.subject) != (issuer, subject):
                raise errors.Conflict(f"user name '{user}' belongs to another single sign-on identity")
            if bound is None:
                if connection.execute(sa.select(users.c.name).where(users.c.name == user)).first() is not None:
                    raise errors.Conflict(
                        f"user name '{user}' belongs to a local user: an admin must rename or delete it before "
                        "its owner signs in with single sign-on"
                    )
                connection.execute(users.insert().values(name=user, is_admin=bool(is_admin), created_at=stamp))
                connection.execute(
                    sso_accounts.insert().values(
                        issuer=issuer, subject=subject, user=user, created_at=stamp, last_login_at=stamp
                    )
                )
            else:
                connection.execute(
                    sso_accounts.update()
                    .where(sso_accounts.c.issuer == issuer, sso_accounts.c.subject == subject)
                    .values(last_login_at=stamp)
                )
            if is_admin is not None:
                connection.execute(users.update().where(users.c.name == user).values(is_admin=is_admin))
            existing = set(connection.execute(sa.select(teams.c.name)).scalars())
            for team in sorted(set(roles) - existing):
                connection.execute(teams.insert().values(name=team, created_at=stamp))
            connection.execute(
                memberships.delete().where(memberships.c.user == user, memberships.c.team.in_(managed_teams))
            )
            for team, role in sorted(roles.items()):
                connection.execute(memberships.insert().values(team=team, user=user, role=role.value))

    # -- logins under way ----------------------------------------------------------------------------------------

    def insert_pending(self, state_hash: str, pending: PendingLogin) -> None:
        with self.engine.begin() as connection:
            connection.execute(sso_pending.delete().where(sso_pending.c.created_at < now() - PENDING_TTL))
            connection.execute(
                sso_pending.insert().values(
                    state_hash=state_hash,
                    binding_hash=pending.binding_hash,
                    nonce=pending.nonce,
                    code_verifier=pending.code_verifier,
                    next_url=pending.next_url,
                    created_at=now(),
                )
            )

    def take_pending(self, state_hash: str) -> PendingLogin | None:
        """The login under way with that state, removed (a state is used once); None if unknown or too old."""
        with self.engine.begin() as connection:
            row = connection.execute(sso_pending.select().where(sso_pending.c.state_hash == state_hash[:64])).first()
            if row is None:
                return None
            connection.execute(sso_pending.delete().where(sso_pending.c.state_hash == row.state_hash))
        if aware(row.created_at) < now() - PENDING_TTL:
            return None
        return PendingLogin(row.binding_hash, row.nonce, row.code_verifier, row.next_url)

    # -- tokens SSO minted ---------------------------------------------------------------------------------------

    def insert_token(self, token_id: str, issuer: str, subject: str, sid: str | None) -> None:
        with self.engine.begin() as connection:
            connection.execute(sso_tokens.insert().values(token_id=token_id, issuer=issuer, subject=subject, sid=sid))

    def minted(self, token_id: str) -> bool:
        query = sa.select(sso_tokens.c.token_id).where(sso_tokens.c.token_id == token_id)
        with self.engine.connect() as connection:
            return connection.execute(query).first() is not None

    def token_ids(self, issuer: str, *, subject: str | None = None, sid: str | None = None) -> list[str]:
        """Tokens minted for that identity, or that provider session (both given: either)."""
        matches = []
        if subject is not None:
            matches.append(sso_tokens.c.subject == subject)
        if sid is not None:
            matches.append(sso_tokens.c.sid == sid)
        if not matches:
            return []
        query = sa.select(sso_tokens.c.token_id).where(sso_tokens.c.issuer == issuer, sa.or_(*matches))
        with self.engine.connect() as connection:
            return list(connection.execute(query).scalars())
