"""``raypod node ...``: operators' verbs on one node of a cluster."""

from __future__ import annotations

from typing import Annotated

import typer

from raypod.cli import clusters as cluster_cli
from raypod.cli import output
from raypod.cli.clusters import NamespaceOpt

app = typer.Typer(help="Replace, cordon and uncordon nodes of a cluster.", no_args_is_help=True)

ClusterArg = Annotated[str, typer.Argument(help="Cluster name.")]
NodeArg = Annotated[str, typer.Argument(help="Node name, as in raypod cluster get (head, <group>-<index>).")]


@app.command()
def replace(cluster: ClusterArg, node: NodeArg, namespace: NamespaceOpt = "default") -> None:
    """Drain the node (when it still answers), then replace it with a new node of its group."""
    cluster_cli.client().clusters.replace_node(cluster, node, namespace)
    output.console.print(f"node {node} of {namespace}/{cluster} will be replaced (raypod cluster events {cluster})")


@app.command()
def cordon(cluster: ClusterArg, node: NodeArg, namespace: NamespaceOpt = "default") -> None:
    """Hold the node out of automatic recovery, to inspect it; it keeps running and keeps its work."""
    cluster_cli.client().clusters.cordon_node(cluster, node, namespace)
    output.console.print(f"node {node} of {namespace}/{cluster} cordoned: raypod will not replace it")


@app.command()
def uncordon(cluster: ClusterArg, node: NodeArg, namespace: NamespaceOpt = "default") -> None:
    """Give the node back to automatic recovery."""
    cluster_cli.client().clusters.uncordon_node(cluster, node, namespace)
    output.console.print(f"node {node} of {namespace}/{cluster} uncordoned")
