"""``raypod job schedule NAME --cron ... -c CLUSTER -- cmd`` and ``raypod schedule list|get|suspend|resume|delete``."""

from __future__ import annotations

import shlex
from typing import Annotated

import typer

from raypod import spec as spec_mod
from raypod import state
from raypod.cli import clusters, output
from raypod.cli.clusters import OutputOpt
from raypod.cli.output import Format

app = typer.Typer(help="Scheduled jobs: list, show, suspend, resume, delete.", no_args_is_help=True)
NamespaceOpt = Annotated[str, typer.Option("--namespace", "-n")]


def schedule(
    name: Annotated[str, typer.Argument(help="The schedule's name.")],
    entrypoint: Annotated[list[str], typer.Argument(help="The command, after --.")],
    cron: Annotated[str, typer.Option(help="Five fields, UTC: '0 3 * * *' is every day at 03:00.")],
    cluster: Annotated[str, typer.Option("--cluster", "-c", help="Cluster its runs go to.")],
    namespace: NamespaceOpt = "default",
    concurrency: Annotated[
        spec_mod.ConcurrencyPolicy, typer.Option(help="While the last run still runs: Allow, Forbid or Replace.")
    ] = spec_mod.ConcurrencyPolicy.ALLOW,
    history_limit: Annotated[int, typer.Option(help="How many of its latest runs it lists.")] = 3,
    max_retries: Annotated[int, typer.Option(help="Each run is resubmitted up to N times when it FAILS.")] = 0,
    fmt: OutputOpt = Format.TABLE,
) -> None:
    """Run a job on a schedule: raypod job schedule nightly --cron '0 3 * * *' -c demo -- python x.py"""
    spec = spec_mod.ScheduleSpec(
        name=name,
        namespace=namespace,
        cluster=cluster,
        cron=cron,
        job=spec_mod.JobSpec(entrypoint=shlex.join(entrypoint), max_retries=max_retries),
        concurrency_policy=concurrency,
        history_limit=history_limit,
    )
    render(clusters.client().schedules.create(spec), fmt)


@app.command("list")
def list_schedules(
    namespace: Annotated[str | None, typer.Option("--namespace", "-n")] = None, fmt: OutputOpt = Format.TABLE
) -> None:
    """Every schedule you may view."""

    def cells(view: state.ScheduleView) -> list[str]:
        return [
            view.spec.namespace,
            view.spec.name,
            view.spec.cron,
            view.spec.cluster,
            "suspended" if view.spec.suspended else view.spec.concurrency_policy.value,
            view.next_run_at.strftime("%Y-%m-%d %H:%M") if view.next_run_at else "-",
            view.last_message or "-",
        ]

    columns = ("NAMESPACE", "NAME", "CRON (UTC)", "CLUSTER", "POLICY", "NEXT RUN", "LAST")
    output.emit_rows(clusters.client().schedules.list(namespace), fmt, columns, cells, "No schedules.")


@app.command()
def get(name: str, namespace: NamespaceOpt = "default", fmt: OutputOpt = Format.TABLE) -> None:
    """A schedule and its latest runs."""
    render(clusters.client().schedules.get(name, namespace), fmt)


@app.command()
def suspend(name: str, namespace: NamespaceOpt = "default") -> None:
    """No run is made until it is resumed (times passed meanwhile are not run)."""
    render(clusters.client().schedules.suspend(name, namespace), Format.TABLE)


@app.command()
def resume(name: str, namespace: NamespaceOpt = "default") -> None:
    render(clusters.client().schedules.resume(name, namespace), Format.TABLE)


@app.command()
def delete(name: str, namespace: NamespaceOpt = "default") -> None:
    """No new run is made; its runs stay (they are jobs)."""
    clusters.client().schedules.delete(name, namespace)
    output.console.print(f"schedule {namespace}/{name} deleted")


def render(view: state.ScheduleView, fmt: Format) -> None:
    if fmt is not Format.TABLE:
        output.emit_data(view, fmt)
        return
    spec = view.spec
    state_words = "suspended" if spec.suspended else f"next run {view.next_run_at:%Y-%m-%d %H:%M} UTC"
    output.console.print(f"[bold]{spec.namespace}/{spec.name}[/bold]  '{spec.cron}' on {spec.cluster}  {state_words}")
    policy = spec.concurrency_policy.value
    output.console.print(f"  job: {spec.job.entrypoint}  (concurrency {policy}, by {view.owner})")
    if view.last_message:
        output.console.print(f"  last: {view.last_message}")
    for job in view.runs:
        output.console.print(f"  {job.id}  {job.status.value:<10} {job.spec.metadata.get('raypod.scheduled_for', '')}")
