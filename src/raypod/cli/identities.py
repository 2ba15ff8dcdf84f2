"""``raypod token|user|team|namespace ...``: identities. A new token is printed once and never again."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from raypod import state
from raypod.cli import clusters, output
from raypod.cli.output import Format

token_app = typer.Typer(help="Create, list and revoke API tokens.", no_args_is_help=True)
user_app = typer.Typer(help="Manage users (admins).", no_args_is_help=True)
team_app = typer.Typer(help="Manage teams and their members.", no_args_is_help=True)
namespace_app = typer.Typer(help="Manage namespaces (a team owns each).", no_args_is_help=True)

OutputOpt = Annotated[Format, typer.Option("--output", "-o", help="table, json or yaml.")]


def _emit(data: Any, fmt: Format) -> None:
    output.emit_data(data, Format.JSON if fmt is Format.TABLE else fmt)


@token_app.command("create")
def token_create(
    name: Annotated[str, typer.Option(help="A label for the token.")] = "cli",
    expires_in_days: Annotated[float | None, typer.Option(help="Lifetime in days (0: never expires).")] = 30,
    user: Annotated[str | None, typer.Option(help="Admins: create the token for this user.")] = None,
    fmt: OutputOpt = Format.TABLE,
) -> None:
    """Create a token; the secret is shown this once."""
    ttl = int(expires_in_days * 86400) if expires_in_days else None
    created = clusters.client().tokens.create(name, ttl, user)
    if fmt is not Format.TABLE:
        _emit(created, fmt)
        return
    output.console.print(f"token {created.id} for {created.user} (expires: {created.expires_at or 'never'})")
    output.console.print("Store it now, it is not shown again:")
    print(created.token)


@token_app.command("list")
def token_list(fmt: OutputOpt = Format.TABLE) -> None:
    _emit(clusters.client().tokens.list(), fmt)


@token_app.command("revoke")
def token_revoke(token_id: str) -> None:
    """Revoke a token; the browser sessions made from it end at once."""
    revoked = clusters.client().tokens.revoke(token_id)
    output.console.print(f"token {revoked.id} revoked")


@user_app.command("create")
def user_create(
    name: str,
    team: Annotated[str | None, typer.Option(help="Add to this team.")] = None,
    role: Annotated[state.Role, typer.Option(help="member or admin (of the team).")] = state.Role.MEMBER,
    admin: Annotated[bool, typer.Option("--admin", help="A raypod administrator.")] = False,
    fmt: OutputOpt = Format.TABLE,
) -> None:
    _emit(clusters.client().users.create(name, team, role, admin), fmt)


@user_app.command("delete")
def user_delete(name: str) -> None:
    """Delete a user: its tokens and sessions end; its queued clusters leave the queue, its running ones stay."""
    done = clusters.client().users.delete(name)
    output.console.print(f"user {done.user} deleted")
    for where in done.dropped_from_queue:
        output.console.print(f"  queued cluster {where} left the queue and is being deleted")
    for where in done.kept:
        output.console.print(f"  cluster {where} runs on (its team's admins manage it)")


@user_app.command("list")
def user_list(fmt: OutputOpt = Format.TABLE) -> None:
    _emit(clusters.client().users.list(), fmt)


@team_app.command("create")
def team_create(name: str) -> None:
    clusters.client().teams.create(name)
    output.console.print(f"team {name} created")


@team_app.command("add-member")
def team_add_member(
    team: str, user: str, role: Annotated[state.Role, typer.Option(help="member or admin")] = state.Role.MEMBER
) -> None:
    clusters.client().teams.add_member(team, user, role)
    output.console.print(f"{user} is now {role.value} of team {team}")


@namespace_app.command("create")
def namespace_create(name: str, team: Annotated[str, typer.Option(help="Team that owns it.")]) -> None:
    clusters.client().namespaces.create(name, team)
    output.console.print(f"namespace {name} created for team {team}")


@namespace_app.command("list")
def namespace_list(fmt: OutputOpt = Format.TABLE) -> None:
    _emit(clusters.client().namespaces.list(), fmt)
