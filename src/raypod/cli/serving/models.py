"""``raypod model ...``: the model catalog that ``raypod serve deploy`` takes models from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

from raypod import errors
from raypod.cli import clusters as cluster_cli
from raypod.cli import output
from raypod.cli.output import Format
from raypod.serving import catalog

app = typer.Typer(help="The model catalog: list, add, show, pull and remove models.", no_args_is_help=True)
OutputOpt = Annotated[Format, typer.Option("--output", "-o", help="table, json or yaml.")]


@app.command("list")
def list_(fmt: OutputOpt = Format.TABLE) -> None:
    def cells(entry: catalog.ModelEntry) -> list[str]:
        return [
            entry.id,
            entry.architecture,
            f"{entry.parameters / 1e6:.1f}M",
            entry.dtype,
            _human(entry.size_bytes),
            _human(entry.memory_bytes),
            str(entry.max_context),
            entry.source,
        ]

    columns = ("ID", "ARCHITECTURE", "PARAMETERS", "DTYPE", "SIZE", "MEMORY/REPLICA", "CONTEXT", "SOURCE")
    empty = "No models. Add one with: raypod model add ID SOURCE (a directory, s3://..., org/name)"
    output.emit_rows(cluster_cli.client().models.list(), fmt, columns, cells, empty)


@app.command()
def add(
    model_id: Annotated[str, typer.Argument(help="Catalog id, e.g. llama-tiny or org/name.")],
    source: Annotated[str, typer.Argument(help="Directory, fsspec URL (s3://bucket/prefix) or Hugging Face id.")],
    storage_options: Annotated[
        str | None, typer.Option(help='fsspec options as JSON, e.g. \'{"endpoint_url": "http://..."}\'.')
    ] = None,
    description: Annotated[str, typer.Option(help="A line about the model.")] = "",
    replace: Annotated[bool, typer.Option(help="Update an existing entry (re-reads its files).")] = False,
    fmt: OutputOpt = Format.TABLE,
) -> None:
    """Add a model: the server reads its config and checksums every file."""
    options: dict[str, Any] = {}
    if storage_options:
        try:
            options = json.loads(storage_options)
        except ValueError as exc:
            raise errors.InvalidSpec(f"--storage-options is not JSON: {exc}") from None
    if "://" not in source and Path(source).exists():
        source = str(Path(source).resolve())  # the server resolves paths itself: give it an absolute one
    output.errors_console.print(f"the server reads and checksums {source} ...")

    def status(addition: catalog.ModelAddition) -> str:
        return str(addition.status)

    progress = output.status_lines(status)
    entry = cluster_cli.client().models.add(model_id, source, options, description, replace, on_progress=progress)
    for warning in entry.warnings:
        output.errors_console.print(f"[yellow]warning:[/yellow] {warning}")
    _render(entry, fmt)


@app.command()
def show(model_id: str, fmt: OutputOpt = Format.TABLE) -> None:
    _render(cluster_cli.client().models.get(model_id), fmt)


@app.command()
def remove(model_id: str) -> None:
    """Remove a model from the catalog (deployments already running keep their staged copy)."""
    removed = cluster_cli.client().models.remove(model_id)
    done = "removed from the catalog" if removed.entry else "no longer to be added"
    output.console.print(f"model {removed.id} {done}")


@app.command()
def pull(
    model_id: str,
    cache: Annotated[Path | None, typer.Option(help="Cache directory (default: the node cache).")] = None,
) -> None:
    """Stage a catalog model here, as a node does before serving it: parallel, resumable, checksummed."""
    from raypod.serving import loader

    entry = cluster_cli.client().models.get(model_id)
    with Progress(
        "[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn()
    ) as bar:
        task = bar.add_task(entry.id, total=entry.size_bytes)
        try:
            path = loader.stage(entry, cache, progress=lambda done, total: bar.update(task, completed=done))
        except catalog.CatalogError as exc:
            raise errors.InvalidSpec(str(exc)) from None
    output.console.print(f"{entry.id} staged at {path}")


def _render(entry: catalog.ModelEntry, fmt: Format) -> None:
    output.emit_one(entry, fmt, _describe)


def _describe(entry: catalog.ModelEntry) -> str:
    return (
        f"[bold]{entry.id}[/bold]  {entry.architecture} ({entry.model_type}), {entry.parameters / 1e6:.1f}M "
        f"parameters, {entry.dtype}\n"
        f"  source: {entry.source}\n"
        f"  size: {_human(entry.size_bytes)} in {len(entry.files)} files; a replica needs "
        f"{_human(entry.memory_bytes)}; context {entry.max_context} tokens; KV "
        f"{_human(entry.kv_bytes_per_token * 1024)} per 1k tokens"
    )


def _human(size: int) -> str:
    for unit, scale in (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if size >= scale:
            return f"{size / scale:.1f}{unit}"
    return f"{size}B"
