"""``raypod audit list|verify|export``: who changed what (installation admins)."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated

import typer

from raypod import errors, state
from raypod import spec as spec_mod
from raypod.cli import clusters, output
from raypod.cli.clusters import OutputOpt
from raypod.cli.output import Format

app = typer.Typer(help="The audit log: who changed what, when, from where (admins).", no_args_is_help=True)


def _since(value: str | None) -> datetime | None:
    """``1h``, ``30m`` or ``7d`` ago, or an ISO date and time."""
    if value is None:
        return None
    try:
        return datetime.now(UTC) - timedelta(seconds=spec_mod.parse_duration(value))
    except ValueError:
        pass
    try:
        found = datetime.fromisoformat(value)
    except ValueError:
        raise errors.InvalidSpec(f"--since: '{value}' is neither a duration (1h, 30m, 7d) nor an ISO time") from None
    return found if found.tzinfo else found.replace(tzinfo=UTC)


@app.command("list")
def list_entries(
    user: Annotated[str | None, typer.Option("--user", "-u", help="Only this user's requests.")] = None,
    cluster: Annotated[str | None, typer.Option("--cluster", "-c", help="Only these: NAME or NAMESPACE/NAME.")] = None,
    since: Annotated[str | None, typer.Option(help="1h, 30m, 7d, or an ISO time.")] = None,
    limit: Annotated[int, typer.Option(help="The newest this many.")] = 200,
    fmt: OutputOpt = Format.TABLE,
) -> None:
    """Changes asked for (API, console, gateway, sign-ins), oldest first, with who, from where and the answer."""
    entries = clusters.client().audit.list(user, cluster, _since(since), limit)

    def cells(entry: state.AuditEntry) -> list[str]:
        return [
            entry.time.strftime("%Y-%m-%d %H:%M:%S"),
            entry.actor or "-",
            entry.source,
            entry.action,
            entry.target or "-",
            str(entry.result),
            entry.client or "-",
        ]

    output.emit_rows(entries, fmt, ("TIME", "USER", "SOURCE", "ACTION", "TARGET", "RESULT", "FROM"), cells)


@app.command()
def verify() -> None:
    """Check the hash chain: exits 1 when an entry was changed or removed."""
    found = clusters.client().audit.verify()
    if not found.intact:
        output.console.print(f"[red]audit log broken[/red] at entry {found.first_bad}: {found.message}")
        raise typer.Exit(1)
    output.console.print(f"audit log intact: {found.message}")


@app.command()
def export(out: Annotated[Path | None, typer.Option("--out", help="A file; default: standard output.")] = None) -> None:
    """Every entry as JSON lines, oldest first."""
    lines = clusters.client().audit.export()
    if out is None:
        sys.stdout.write(lines)
    else:
        out.write_text(lines)
        output.console.print(f"{lines.count(chr(10))} entries written to {out}")
