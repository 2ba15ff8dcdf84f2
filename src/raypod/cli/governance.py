"""``raypod quota ...`` and ``raypod queue list``: teams' quotas, and the clusters waiting for admission."""

from __future__ import annotations

from typing import Annotated, Any

import typer
import yaml

from raypod import spec as spec_mod
from raypod import state
from raypod.cli import clusters as cluster_cli
from raypod.cli import output
from raypod.cli.output import Format

app = typer.Typer(help="Teams' quotas: what their clusters may hold together.", no_args_is_help=True)
queue_app = typer.Typer(help="Clusters waiting for their team's quota or for the pool.", no_args_is_help=True)
OutputOpt = Annotated[Format, typer.Option("--output", "-o", help="table, json or yaml.")]


TeamArg = Annotated[str | None, typer.Argument(help="The team (leave out with --namespace).")]
NamespaceOpt = Annotated[
    str | None, typer.Option("--namespace", "-n", help="A namespace's own cap, inside its team's quota.")
]


@app.command("set")
def set_(
    team: TeamArg = None,
    namespace: NamespaceOpt = None,
    cpus: Annotated[float | None, typer.Option(help="Ray CPUs of all the team's nodes together.")] = None,
    memory: Annotated[str | None, typer.Option(help="Memory plus object store, e.g. 64Gi.")] = None,
    gpus: Annotated[int | None, typer.Option()] = None,
    clusters: Annotated[int | None, typer.Option()] = None,
    nodes: Annotated[int | None, typer.Option()] = None,
    policy: Annotated[str, typer.Option(help="queue (work beyond the quota waits) or reject.")] = "queue",
    borrow: Annotated[bool, typer.Option(help="May use quota other teams leave idle.")] = False,
    fmt: OutputOpt = Format.TABLE,
) -> None:
    """Set a team's quota (team admins): raypod quota set ml --cpus 16 --memory 64Gi --borrow;
    or cap one of its namespaces inside it: raypod quota set --namespace ml-dev --cpus 4"""
    fields: dict[str, Any] = {"cpus": cpus, "memory": memory, "gpus": gpus, "clusters": clusters, "nodes": nodes}
    quota = spec_mod.QuotaSpec.model_validate(
        {**{k: v for k, v in fields.items() if v is not None}, "policy": policy, "borrow": borrow}
    )
    _render([cluster_cli.client().quotas.set(team, quota, namespace=namespace)], fmt)


@app.command()
def get(team: TeamArg = None, namespace: NamespaceOpt = None, fmt: OutputOpt = Format.TABLE) -> None:
    view = cluster_cli.client().quotas.get(team, namespace=namespace)
    if fmt is not Format.TABLE:
        output.emit_data(view, fmt)
        return
    _render([view], fmt)


@app.command("list")
def list_(fmt: OutputOpt = Format.TABLE) -> None:
    _render(cluster_cli.client().quotas.list(), fmt)


@app.command()
def delete(team: TeamArg = None, namespace: NamespaceOpt = None) -> None:
    """Remove a team's quota (its clusters are then limited only by the pool), or a namespace's own cap."""
    cluster_cli.client().quotas.delete(team, namespace=namespace)
    if namespace:
        output.errors_console.print(f"namespace {namespace} has no quota of its own now: its team's applies")
    else:
        output.errors_console.print(f"team {team} has no quota now")


@app.command("kueue")
def kueue_objects() -> None:
    """Admins: print every quota as Kueue objects (YAML), for kubectl apply -f - where Kueue admits."""
    print(yaml.safe_dump_all(cluster_cli.client().quotas.kueue(), sort_keys=False), end="")


@queue_app.command("list")
def queue_list(fmt: OutputOpt = Format.TABLE) -> None:
    """What waits, in the order it will be admitted, and why."""

    def cells(entry: state.QueueEntry) -> list[str]:
        name = entry.name + (" (scale-up)" if entry.kind == "scale" else "")
        return [str(entry.position), entry.namespace, name, entry.team, entry.priority, entry.reason]

    columns = ("#", "NAMESPACE", "CLUSTER", "TEAM", "PRIORITY", "WAITING BECAUSE")
    output.emit_rows(cluster_cli.client().quotas.queue(), fmt, columns, cells, "Nothing waits.")


def _render(views: list[state.QuotaView], fmt: Format) -> None:
    def cells(view: state.QuotaView) -> list[str]:
        quota = view.quota
        return [
            view.team if view.namespace is None else f"{view.team} (namespace {view.namespace})",
            _used(view.usage["cpus"], quota.cpus),
            _used(view.usage["memory"], quota.memory, memory=True),
            _used(view.usage["gpus"], quota.gpus),
            _used(view.usage["clusters"], quota.clusters),
            _used(view.usage["nodes"], quota.nodes),
            quota.policy.value + (" +borrow" if quota.borrow else ""),
            str(view.queued),
        ]

    columns = ("TEAM", "CPUS", "MEMORY", "GPUS", "CLUSTERS", "NODES", "POLICY", "QUEUED")
    empty = "No quotas. Set one with: raypod quota set TEAM --cpus 16 --memory 64Gi"
    output.emit_rows(views, fmt, columns, cells, empty)


def _used(value: float, limit: float | None, *, memory: bool = False) -> str:
    def shown(amount: float) -> str:
        return spec_mod.format_bytes(int(amount)) if memory else f"{amount:g}"

    return f"{shown(value)}/{shown(limit) if limit is not None else '-'}"
