"""Renders models for people (rich tables) and for programs (json, yaml). The only place the CLI prints."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from raypod import state


def _console(stderr: bool = False) -> Console:
    """A terminal gets Rich's layout at its width; output piped or captured is never wrapped (a line a user copies,
    an "OpenAI base_url:" or a command hint, stays one line)."""
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=100_000, soft_wrap=True)


console = _console()
errors_console = _console(stderr=True)


T = TypeVar("T")


def status_lines(describe: Callable[[T], str]) -> Callable[[T], None]:
    """An ``on_progress`` callback for the SDK's waits: prints a line to stderr whenever what it says changes."""
    seen = ""

    def show(current: T) -> None:
        nonlocal seen
        line = describe(current)
        if line != seen:
            errors_console.print(line)
            seen = line

    return show


class Format(StrEnum):
    TABLE = "table"
    JSON = "json"
    YAML = "yaml"


def emit_data(data: Any, fmt: Format) -> None:
    """Print data (plain, or pydantic models) as JSON or YAML, without rich markup so programs can parse it."""
    if isinstance(data, BaseModel) or (isinstance(data, list) and data and isinstance(data[0], BaseModel)):
        data = _dump(data)
    if fmt is Format.YAML:
        print(yaml.safe_dump(data, sort_keys=False), end="")
    else:
        print(json.dumps(data, indent=2))


def emit_one(item: T, fmt: Format, describe: Callable[[T], str]) -> None:
    """One object as JSON or YAML, or ``describe``'s lines for people."""
    if fmt is not Format.TABLE:
        emit_data(item, fmt)
        return
    console.print(describe(item))


def emit_rows(
    items: Sequence[T], fmt: Format, columns: Sequence[str], cells: Callable[[T], Sequence[str]], empty: str = ""
) -> None:
    """A list as JSON or YAML, or a table of ``columns`` (``cells`` gives an item's row); ``empty`` is said
    instead of an empty table (how to make the first one)."""
    if fmt is not Format.TABLE:
        emit_data(list(items), fmt)
        return
    if not items and empty:
        console.print(empty)
        return
    table = Table(box=None, header_style="bold")
    for column in columns:
        table.add_column(column)
    for item in items:
        table.add_row(*cells(item))
    console.print(table)


def _dump(item: BaseModel | list[Any]) -> Any:
    if isinstance(item, list):
        return [entry.model_dump(mode="json") for entry in item]
    return item.model_dump(mode="json")


def dashboard_url(server: str, view: state.ClusterView) -> str:
    """Where a user opens a cluster's Ray dashboard: raypod's gateway (a browser is sent on to the cluster's own
    origin), never the dashboard's loopback address."""
    if not view.status.endpoints.get("dashboard"):
        return "-"
    return f"{server.rstrip('/')}/clusters/{view.spec.namespace}/{view.spec.name}/"


def render_clusters(views: list[state.ClusterView], fmt: Format, server: str = "") -> None:
    def cells(view: state.ClusterView) -> list[str]:
        return [
            view.spec.namespace,
            view.spec.name,
            _phase(view),
            f"{view.status.ready_nodes}/{view.status.desired_nodes}",
            ", ".join(f"{g.name}={g.replicas}" for g in view.spec.worker_groups) or "-",
            dashboard_url(server, view),
            _age(view),
        ]

    columns = ("NAMESPACE", "NAME", "PHASE", "NODES", "WORKER GROUPS", "DASHBOARD", "AGE")
    emit_rows(views, fmt, columns, cells, "No clusters. Create one with: raypod cluster create NAME --workers 2")


def render_cluster(view: state.ClusterView, fmt: Format, server: str = "") -> None:
    if fmt is not Format.TABLE:
        emit_data(_dump(view), fmt)
        return
    status = view.status
    console.print(f"[bold]{view.spec.namespace}/{view.spec.name}[/bold]  {_phase(view)}  {status.message}")
    if server and status.endpoints.get("dashboard"):
        console.print(f"  {'open':<10} {dashboard_url(server, view)}")
    for key, value in status.endpoints.items():
        console.print(f"  {key:<10} {value}")
    table = Table(box=None, header_style="bold")
    for column in ("NODE", "GROUP", "PHASE", "HEALTH", "PID", "RAY NODE ID", "REASON"):
        table.add_column(column)
    for node in status.nodes:
        health = node.health.value + (" (cordoned)" if node.cordoned else "")
        if node.health is not state.NodeHealthState.HEALTHY and node.health is not state.NodeHealthState.UNKNOWN:
            health = f"[yellow]{health}[/yellow]"
        reason = "; ".join(filter(None, [node.reason, *node.health_reasons]))
        table.add_row(
            node.name,
            node.group,
            node.phase.value,
            health,
            str(node.pid or "-"),
            (node.ray_node_id or "-")[:12],
            reason,
        )
    console.print(table)
    scaling = status.autoscaling
    if scaling is not None and (scaling.pending or scaling.message):
        console.print("  [bold]pending demand[/bold] (Ray waits for it; the autoscaler says why)")
        for demand in scaling.pending:
            console.print(f"  {demand.describe():<40} {demand.reason}")
        if scaling.message:
            console.print(f"  [yellow]{scaling.message}[/yellow]")
    for condition in status.conditions:
        # Conditions that name a problem (ReplicaFailure, ReplacementLimitReached) are fine when false.
        good = condition.status != (condition.type in ("ReplicaFailure", "ReplacementLimitReached"))
        mark = f"[green]{condition.status}[/green]" if good else f"[yellow]{condition.status}[/yellow]"
        console.print(f"  {condition.type:<24} {mark}  {condition.reason}  {condition.message}")


def render_events(events: list[state.Event], fmt: Format) -> None:
    def cells(event: state.Event) -> list[str]:
        kind = f"[yellow]{event.type.value}[/yellow]" if event.type is state.EventType.WARNING else event.type.value
        return [event.time.strftime("%H:%M:%S"), kind, event.reason, event.node or "-", event.message]

    emit_rows(events, fmt, ("TIME", "TYPE", "REASON", "NODE", "MESSAGE"), cells)


def _phase(view: state.ClusterView) -> str:
    colours = {
        state.ClusterPhase.READY: "green",
        state.ClusterPhase.DEGRADED: "yellow",
        state.ClusterPhase.FAILED: "red",
    }
    colour = colours.get(view.status.phase)
    return f"[{colour}]{view.status.phase.value}[/{colour}]" if colour else view.status.phase.value


def _age(view: state.ClusterView) -> str:
    from datetime import UTC, datetime

    seconds = int((datetime.now(UTC) - view.created_at).total_seconds())
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"
