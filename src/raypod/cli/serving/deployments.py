"""``raypod serve ...``: catalog models on a cluster's Ray Serve, behind the OpenAI-compatible API."""

from __future__ import annotations

from typing import Annotated

import typer

from raypod import errors, state
from raypod import spec as spec_mod
from raypod.cli import clusters as cluster_cli
from raypod.cli import output
from raypod.cli.output import Format

app = typer.Typer(help="Deploy catalog models onto a cluster's Ray Serve (OpenAI API).", no_args_is_help=True)
OutputOpt = Annotated[Format, typer.Option("--output", "-o", help="table, json or yaml.")]
ClusterOpt = Annotated[str, typer.Option("--cluster", "-c", help="The cluster.")]
NamespaceOpt = Annotated[str, typer.Option("--namespace", "-n")]


@app.command()
def deploy(
    model: Annotated[str, typer.Argument(help="A catalog model id (raypod model list).")],
    cluster: ClusterOpt,
    namespace: NamespaceOpt = "default",
    name: Annotated[str | None, typer.Option(help="Application name and route (default: from the model).")] = None,
    replicas: Annotated[int, typer.Option(help="Replicas (ignored with --autoscale).")] = 1,
    autoscale: Annotated[str | None, typer.Option(help="MIN:MAX replicas, scaled on requests in flight.")] = None,
    cpus: Annotated[float, typer.Option(help="Logical CPUs per replica.")] = 1.0,
    engine: Annotated[str, typer.Option(help="auto, cpu or vllm (auto: vLLM where there are GPUs).")] = "auto",
    kv_cache: Annotated[bool, typer.Option("--kv-cache/--no-kv-cache", help="The tiered KV cache.")] = True,
    l1: Annotated[str | None, typer.Option(help="L1 pool per node, e.g. 2Gi (default: half the object store).")] = None,
    l2: Annotated[
        str | None, typer.Option(help="Shared tier: redis://... or an fsspec URL; 'none'; default: raypod's Redis.")
    ] = None,
    reserve_tokens: Annotated[
        int | None,
        typer.Option(help="Tokens of keys and values a CPU replica allocates at start (default: context, <= 8192)."),
    ] = None,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Wait until it serves.")] = True,
    fmt: OutputOpt = Format.TABLE,
) -> None:
    """Deploy a model: raypod serve deploy llama-tiny -c demo --replicas 2"""
    try:
        spec = spec_mod.ServeDeploySpec(
            model=model,
            name=name,
            replicas=replicas,
            autoscale=spec_mod.parse_autoscale(autoscale) if autoscale else None,
            cpus=cpus,
            engine=engine,
            kv_cache=kv_cache,
            l1_bytes=spec_mod.parse_bytes(l1) if l1 else None,
            l2=l2,
            reserve_tokens=reserve_tokens,
        )
    except ValueError as exc:
        raise errors.InvalidSpec(str(exc)) from None
    api = cluster_cli.client()
    deployment = api.serving.deploy(cluster, spec, namespace)
    output.errors_console.print(f"deploying {deployment.model} as {deployment.name} on {namespace}/{cluster}")
    if wait:
        progress = output.status_lines(_phase_line)
        deployment = api.serving.wait_running(cluster, deployment.name, namespace, on_progress=progress)
    _render(deployment, fmt, api.serving.openai_base_url(cluster, deployment.name, namespace))


def _phase_line(deployment: state.DeploymentView) -> str:
    return f"{deployment.status}: {deployment.message}"


@app.command("list")
def list_(cluster: ClusterOpt, namespace: NamespaceOpt = "default", fmt: OutputOpt = Format.TABLE) -> None:
    def cells(deployment: state.DeploymentView) -> list[str]:
        running = sum(r.state == "RUNNING" for r in deployment.replicas)
        return [
            deployment.name,
            deployment.model,
            deployment.status,
            f"{running}/{len(deployment.replicas)}",
            deployment.engine,
            deployment.openai_base_url,
        ]

    columns = ("NAME", "MODEL", "STATUS", "REPLICAS", "ENGINE", "OPENAI BASE URL")
    empty = f"No models on {namespace}/{cluster}. Deploy one with: raypod serve deploy MODEL -c {cluster}"
    output.emit_rows(cluster_cli.client().serving.list(cluster, namespace), fmt, columns, cells, empty)


@app.command()
def status(name: str, cluster: ClusterOpt, namespace: NamespaceOpt = "default", fmt: OutputOpt = Format.TABLE) -> None:
    api = cluster_cli.client()
    _render(api.serving.get(cluster, name, namespace), fmt, api.serving.openai_base_url(cluster, name, namespace))


@app.command()
def delete(name: str, cluster: ClusterOpt, namespace: NamespaceOpt = "default") -> None:
    cluster_cli.client().serving.delete(cluster, name, namespace)
    output.console.print(f"deployment {name} is being deleted from {namespace}/{cluster}")


def _render(deployment: state.DeploymentView, fmt: Format, base_url: str) -> None:
    output.emit_one(deployment, fmt, lambda d: _describe(d, base_url))


def _describe(deployment: state.DeploymentView, base_url: str) -> str:
    return (
        f"[bold]{deployment.name}[/bold]  {deployment.model} on {deployment.namespace}/{deployment.cluster}: "
        f"{deployment.status} ({deployment.message})\n"
        f"  engine {deployment.engine}; replicas: "
        + (", ".join(f"{r.state}" for r in deployment.replicas) or "none yet")
        + f"\n  OpenAI base_url: {base_url}  (api_key: a raypod token)"
    )
