"""``raypod cluster ...``: each command parses arguments, makes one client call and renders the result."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from raypod import config, errors, state
from raypod import spec as spec_mod
from raypod.backends.kuberay import manifests
from raypod.cli import output
from raypod.cli.output import Format
from raypod.client import Client

app = typer.Typer(help="Create, list, inspect, scale and delete Ray clusters.", no_args_is_help=True)

NamespaceOpt = Annotated[str, typer.Option("--namespace", "-n", help="Namespace of the cluster.")]
OutputOpt = Annotated[Format, typer.Option("--output", "-o", help="table, json or yaml.")]
WaitOpt = Annotated[bool, typer.Option("--wait/--no-wait", help="Wait until the change is done.")]
TimeoutOpt = Annotated[float, typer.Option(help="Seconds to wait.")]


def client() -> Client:
    return Client()


def build_spec(
    name: str,
    namespace: str,
    file: Path | None,
    workers: int | None,
    worker_cpus: int | None,
    worker_memory: str | None,
    head_cpus: int | None,
    group: str,
) -> spec_mod.ClusterSpec:
    """A spec from a file and/or the common-case shortcuts (one worker group)."""
    data: dict[str, object] = {}
    if file is not None:
        try:
            text = file.read_text()
        except OSError as exc:
            raise errors.InvalidSpec(f"cannot read spec file {file}: {exc.strerror}") from None
        data = spec_mod.load_spec_data(text)
    data["name"] = name
    if namespace != "default" or "namespace" not in data:
        data["namespace"] = namespace
    if head_cpus is not None:
        data["head"] = {**_mapping(data.get("head")), "cpus": head_cpus}
    if workers is not None or worker_cpus is not None or worker_memory is not None:
        groups = [g for g in _list(data.get("worker_groups")) if isinstance(g, dict)]
        existing = next((g for g in groups if g.get("name") == group), None)
        if existing is None:
            existing = {"name": group}
            groups.append(existing)
        if workers is not None:
            existing["replicas"] = workers
        if worker_cpus is not None:
            existing["cpus"] = worker_cpus
        if worker_memory is not None:
            existing["memory"] = worker_memory
        data["worker_groups"] = groups
    return spec_mod.parse_spec(data)


@app.command()
def create(
    name: Annotated[str, typer.Argument(help="Cluster name (lowercase letters, digits, '-').")],
    namespace: NamespaceOpt = "default",
    file: Annotated[Path | None, typer.Option("--file", "-f", help="Spec file (YAML or JSON).")] = None,
    workers: Annotated[int | None, typer.Option("--workers", help="Worker nodes in the group.")] = None,
    worker_cpus: Annotated[int | None, typer.Option("--worker-cpus", help="CPUs per worker node.")] = None,
    worker_memory: Annotated[str | None, typer.Option("--worker-memory", help="Memory per worker, e.g. 2Gi.")] = None,
    head_cpus: Annotated[int | None, typer.Option("--head-cpus", help="CPUs of the head node.")] = None,
    group: Annotated[str, typer.Option("--group", help="Worker group the shortcuts apply to.")] = "workers",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the KubeRay RayCluster; create nothing.")] = False,
    fmt: OutputOpt = Format.TABLE,
    wait: WaitOpt = True,
    timeout: TimeoutOpt = 300.0,
) -> None:
    """Create a cluster; by default wait, with progress, until every node runs."""
    spec = build_spec(name, namespace, file, workers, worker_cpus, worker_memory, head_cpus, group)
    if dry_run:
        output.emit_data(_manifest(spec), Format.JSON if fmt is Format.JSON else Format.YAML)
        return
    api = client()
    view = api.clusters.create(spec)
    if wait:
        view = wait_with_progress(api, spec.name, spec.namespace, view.status.desired_nodes or 1, timeout)
    output.render_cluster(view, fmt)


def wait_with_progress(api: Client, name: str, namespace: str, total: int, timeout: float) -> state.ClusterView:
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} nodes"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=output.errors_console, transient=True) as progress:
        task = progress.add_task(f"starting {namespace}/{name}", total=total)

        def show(view: state.ClusterView) -> None:
            progress.update(task, completed=view.status.ready_nodes, total=view.status.desired_nodes or total)

        return api.clusters.wait_ready(name, namespace, timeout=timeout, on_progress=show)


@app.command("list")
def list_(
    namespace: Annotated[str | None, typer.Option("--namespace", "-n", help="Only this namespace.")] = None,
    fmt: OutputOpt = Format.TABLE,
) -> None:
    """List clusters of every namespace (or one)."""
    api = client()
    output.render_clusters(api.clusters.list(namespace), fmt, api.server)


@app.command()
def get(name: str, namespace: NamespaceOpt = "default", fmt: OutputOpt = Format.TABLE) -> None:
    """Show a cluster: phase, endpoints, nodes and conditions."""
    api = client()
    output.render_cluster(api.clusters.get(name, namespace), fmt, api.server)


@app.command()
def history(name: str, namespace: NamespaceOpt = "default", fmt: OutputOpt = Format.TABLE) -> None:
    """Show a deleted cluster as history kept it: its last nodes, its events and its jobs."""
    record = client().clusters.history(name, namespace)
    if fmt is not Format.TABLE:
        output.emit_data(record.model_dump(mode="json"), fmt)
        return
    view = record.cluster
    archived = f"{record.archived_at:%Y-%m-%d %H:%M} UTC"
    output.console.print(f"{view.spec.namespace}/{view.spec.name}: deleted, archived {archived}")
    for node in view.status.nodes:
        output.console.print(f"  node {node.name:<24} {node.group:<12} {node.phase.value}")
    for job in record.jobs:
        by = job.owner or "-"
        output.console.print(f"  job  {job.id:<24} {job.status.value:<10} by={by}  {job.spec.entrypoint[:50]}")
    for event in record.events[-20:]:
        output.console.print(f"  {event.time:%H:%M:%S} {event.reason}: {event.message[:100]}")


@app.command()
def scale(
    name: str,
    replicas: Annotated[int, typer.Argument(help="Desired worker nodes in the group.")],
    namespace: NamespaceOpt = "default",
    group: Annotated[str | None, typer.Option("--group", "-g", help="Worker group (default: the only one).")] = None,
    fmt: OutputOpt = Format.TABLE,
    wait: WaitOpt = True,
    timeout: TimeoutOpt = 300.0,
) -> None:
    """Scale a worker group; nodes removed by a scale-down are drained first."""
    api = client()
    if group is None:
        groups = [g.name for g in api.clusters.get(name, namespace).spec.worker_groups]
        if len(groups) != 1:
            raise errors.InvalidSpec(f"cluster '{name}' has groups {', '.join(groups) or 'none'}: pass --group")
        group = groups[0]
    view = api.clusters.scale(name, group, replicas, namespace)
    if wait:
        view = wait_with_progress(api, name, namespace, view.status.desired_nodes, timeout)
    output.render_cluster(view, fmt)


@app.command()
def resume(
    name: str,
    namespace: NamespaceOpt = "default",
    fmt: OutputOpt = Format.TABLE,
    wait: WaitOpt = True,
    timeout: TimeoutOpt = 300.0,
) -> None:
    """Bring a suspended cluster back: its nodes start again (it waits in the queue when its team is at its quota)."""
    api = client()
    view = api.clusters.resume(name, namespace)
    if wait and not view.queued:
        view = wait_with_progress(api, name, namespace, view.status.desired_nodes, timeout)
    output.render_cluster(view, fmt)


@app.command()
def delete(name: str, namespace: NamespaceOpt = "default", wait: WaitOpt = True, timeout: TimeoutOpt = 120.0) -> None:
    """Delete a cluster: every process it started stops and its ports are freed."""
    api = client()
    api.clusters.delete(name, namespace)
    if wait:
        api.clusters.wait_deleted(name, namespace, timeout=timeout)
        output.console.print(f"cluster {namespace}/{name} deleted")
    else:
        output.console.print(f"cluster {namespace}/{name} is being deleted")


@app.command()
def events(name: str, namespace: NamespaceOpt = "default", fmt: OutputOpt = Format.TABLE) -> None:
    """What happened to a cluster: created, nodes started, died, replaced, scaled, deleted."""
    output.render_events(client().clusters.events(name, namespace), fmt)


@app.command()
def manifest(name: str, namespace: NamespaceOpt = "default", fmt: OutputOpt = Format.YAML) -> None:
    """Print the KubeRay RayCluster equivalent of an existing cluster."""
    output.emit_data(client().clusters.manifest(name, namespace), Format.JSON if fmt is Format.JSON else Format.YAML)


def _mapping(value: object) -> dict[str, object]:
    return dict(value) if isinstance(value, dict) else {}


def _list(value: object) -> list[object]:
    return list(value) if isinstance(value, list) else []


def _manifest(spec: spec_mod.ClusterSpec) -> dict[str, Any]:
    """The RayCluster with its pods' add-ons (the hangwatch agent, workspaces' IDEs) as the server renders them;
    the server adds the agents' credential (a Secret) when it applies it."""
    from raypod.controlplane.addons import NodeAddonMaker

    maker = NodeAddonMaker(config.default_home())
    return manifests.raycluster(spec, node_addons=lambda node: maker("dry-run", node))
