"""``raypod space ...``: workspaces (JupyterLab or a code editor) that join a cluster as zero-compute nodes."""

from __future__ import annotations

import webbrowser
from typing import Annotated

import typer

from raypod import state
from raypod.cli import clusters as cluster_cli
from raypod.cli import output
from raypod.cli.output import Format

app = typer.Typer(help="Workspaces: an IDE on a cluster, whose notebooks are drivers of it.", no_args_is_help=True)
OutputOpt = Annotated[Format, typer.Option("--output", "-o", help="table, json or yaml.")]
NamespaceOpt = Annotated[str, typer.Option("--namespace", "-n")]


@app.command()
def create(
    name: str,
    cluster: Annotated[str, typer.Option("--cluster", "-c", help="The cluster it joins.")],
    namespace: NamespaceOpt = "default",
    kind: Annotated[str, typer.Option(help="jupyterlab or code-editor.")] = "jupyterlab",
    memory: Annotated[str | None, typer.Option(help="Memory Ray schedules against on its node, e.g. 2Gi.")] = None,
    python_env: Annotated[
        str | None,
        typer.Option(help="A Python environment (a venv's directory) for the kernels; it needs ipykernel and Ray."),
    ] = None,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Wait until its IDE answers.")] = True,
    fmt: OutputOpt = Format.TABLE,
) -> None:
    """Create a workspace: raypod space create nb -c demo"""
    api = cluster_cli.client()
    space = api.spaces.create(name, cluster, kind, namespace, memory, python_env)
    output.errors_console.print(f"workspace {name} ({kind}) joins {namespace}/{cluster} as node {space.node}")
    if wait:
        space = api.spaces.wait_ready(name, namespace, on_progress=output.status_lines(_phase))
    _render(space, fmt, api.spaces.url(name, namespace))


@app.command("list")
def list_(
    namespace: Annotated[str | None, typer.Option("--namespace", "-n")] = None, fmt: OutputOpt = Format.TABLE
) -> None:
    def cells(space: state.SpaceView) -> list[str]:
        return [space.name, space.namespace, space.cluster, space.kind, space.state, space.owner or "", space.url]

    columns = ("NAME", "NAMESPACE", "CLUSTER", "KIND", "STATE", "OWNER", "URL")
    empty = "No workspaces. Create one with: raypod space create NAME -c CLUSTER"
    output.emit_rows(cluster_cli.client().spaces.list(namespace), fmt, columns, cells, empty)


@app.command()
def get(name: str, namespace: NamespaceOpt = "default", fmt: OutputOpt = Format.TABLE) -> None:
    api = cluster_cli.client()
    _render(api.spaces.get(name, namespace), fmt, api.spaces.url(name, namespace))


@app.command()
def stop(name: str, namespace: NamespaceOpt = "default") -> None:
    """Stop its node and IDE; its files are kept."""
    cluster_cli.client().spaces.stop(name, namespace)
    output.console.print(f"workspace {name} is stopping; its files are kept")


@app.command()
def start(
    name: str,
    namespace: NamespaceOpt = "default",
    wait: Annotated[bool, typer.Option("--wait/--no-wait")] = True,
) -> None:
    api = cluster_cli.client()
    api.spaces.start(name, namespace)
    if wait:
        api.spaces.wait_ready(name, namespace, on_progress=output.status_lines(_phase))
    output.console.print(f"workspace {name} is starting: {api.spaces.url(name, namespace)}")


@app.command()
def move(
    name: str,
    cluster: Annotated[str, typer.Option("--cluster", "-c", help="The cluster it moves to.")],
    namespace: NamespaceOpt = "default",
) -> None:
    """Move a workspace to another cluster of its namespace; its files go with it."""
    cluster_cli.client().spaces.move(name, cluster, namespace)
    output.console.print(f"workspace {name} moves to {namespace}/{cluster}")


@app.command()
def delete(
    name: str,
    namespace: NamespaceOpt = "default",
    keep_files: Annotated[bool, typer.Option("--keep-files/--delete-files", help="Keep its files (default).")] = True,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask before deleting its files.")] = False,
) -> None:
    if not keep_files and not yes:
        typer.confirm(f"Delete workspace {name} and all its files?", abort=True)
    cluster_cli.client().spaces.delete(name, namespace, keep_files)
    kept = "its files are kept" if keep_files else "its files are deleted once its node is gone"
    output.console.print(f"workspace {name} is deleted; {kept}")


@app.command()
def attach(name: str, namespace: NamespaceOpt = "default") -> None:
    """Open the workspace in a browser (log in to the console first)."""
    url = cluster_cli.client().spaces.url(name, namespace)
    output.console.print(url)
    webbrowser.open(url)


def _phase(space: state.SpaceView) -> str:
    return f"{space.state}: {space.message}" if space.message else space.state


def _render(space: state.SpaceView, fmt: Format, url: str) -> None:
    output.emit_one(space, fmt, lambda s: _describe(s, url))


def _describe(space: state.SpaceView, url: str) -> str:
    return (
        f"[bold]{space.name}[/bold]  {space.kind} on {space.namespace}/{space.cluster} (node {space.node}): "
        f"{space.state}{f' ({space.message})' if space.message else ''}\n  open: {url}"
    )
