"""The ``raypod`` command. Errors are caught once, here: one line on stderr and exit 1 (``--debug`` for more)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import pydantic
import typer
from typer.core import TyperGroup

from raypod import config, errors, state
from raypod import spec as spec_mod
from raypod.cli import (
    audit,
    clusters,
    daemon,
    governance,
    identities,
    jobs,
    node,
    observability,
    output,
    schedules,
    serving,
    spaces,
    sso,
)
from raypod.client import Client, connection_settings


class _Group(TyperGroup):
    def invoke(self, ctx: typer.Context) -> Any:  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except (errors.RaypodError, pydantic.ValidationError) as exc:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            # A spec the CLI built from options (a job, a quota) is checked before it is sent: one line per problem.
            message = exc.message if isinstance(exc, errors.RaypodError) else spec_mod.describe_validation_error(exc)
            output.errors_console.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
            raise typer.Exit(1) from None


app = typer.Typer(
    cls=_Group,
    help="raypod: Ray clusters without YAML.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
NOUNS = {
    "cluster": clusters.app,
    "job": jobs.app,
    "node": node.app,
    "model": serving.models.app,
    "serve": serving.deployments.app,
    "space": spaces.app,
    "monitoring": observability.app,
    "quota": governance.app,
    "queue": governance.queue_app,
    "token": identities.token_app,
    "user": identities.user_app,
    "team": identities.team_app,
    "namespace": identities.namespace_app,
    "audit": audit.app,
    "schedule": schedules.app,
}
for noun, commands in NOUNS.items():
    app.add_typer(commands, name=noun)
app.command()(sso.login)

SHUTDOWN_GRACE_S = 5  # seconds a stopping server gives open connections


@app.callback()
def _root(
    ctx: typer.Context,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    ctx.obj = {"debug": debug}


@app.command()
def server(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = config.DEFAULT_PORT,
    tls_cert: Annotated[Path | None, typer.Option(help="PEM certificate (default: self-signed, made once).")] = None,
    tls_key: Annotated[Path | None, typer.Option(help="PEM private key of --tls-cert.")] = None,
    insecure_http: Annotated[bool, typer.Option(help="Serve plain HTTP (only behind a TLS proxy).")] = False,
    access_log: Annotated[bool, typer.Option(help="Log every request (method, path, status).")] = False,
) -> None:
    """Run the control plane (API, gateway, reconcile loop) in the foreground."""
    import uvicorn

    from raypod.server import tls
    from raypod.server.app import create_app

    if (tls_cert is None) != (tls_key is None):
        raise errors.InvalidSpec("pass both --tls-cert and --tls-key, or neither for a self-signed certificate")
    home = config.default_home()
    if not insecure_http and tls_cert is None:
        tls_cert, tls_key = tls.self_signed(home, host, config.Settings.from_env().origin_domain)
    own_ca = tls.ca_path(home) if tls_cert == home / "tls" / "server.crt" else None
    settings = config.Settings.from_env(
        host=host, port=port, tls=not insecure_http, tls_cert=tls_cert, tls_key=tls_key, tls_ca=own_ca
    )
    uvicorn.run(
        create_app(settings),
        host=host,
        port=port,
        log_level="info",
        access_log=access_log,
        ssl_certfile=str(tls_cert) if settings.tls else None,
        ssl_keyfile=str(tls_key) if settings.tls else None,
        # Websockets (job log follow) must survive a busy host: ping to keep paths open, never time out on a
        # late pong; a connection ends when either side closes it.
        ws_ping_interval=settings.ws_ping_interval_s,
        ws_ping_timeout=None,
        # A client that keeps a connection open (an SDK in a notebook, a followed log) cannot hold a stop for
        # long: connections get this many seconds, then the loops stop cleanly (daemon.stop kills at 30 s).
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
    )


@app.command()
def up(
    name: Annotated[str, typer.Option(help="Name of the default cluster.")] = "local",
    workers: Annotated[int, typer.Option("--workers", help="Worker nodes of the default cluster.")] = 2,
    worker_cpus: Annotated[int, typer.Option("--worker-cpus", help="CPUs per worker node.")] = 1,
    port: Annotated[int, typer.Option(help="Port of the local server.")] = config.DEFAULT_PORT,
    no_cluster: Annotated[bool, typer.Option("--no-cluster", help="Start only the server.")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the cluster.")] = 300.0,
) -> None:
    """Start the raypod server in the background and a default local cluster; print where to look."""
    home = config.default_home()
    url = config.default_server_url() if os.environ.get("RAYPOD_SERVER") else f"https://127.0.0.1:{port}"
    if not daemon.is_healthy(url, connection_settings(url).verify):
        log = daemon.start(home, "127.0.0.1", port)
        output.console.print(f"raypod server started at {url} (log: {log})")
    else:
        output.console.print(f"raypod server already running at {url}")
    api = Client(url)
    view: state.ClusterView | None = None
    if not no_cluster:
        spec = clusters.build_spec(name, "default", None, workers, worker_cpus, None, None, "workers")
        try:
            view = api.clusters.create(spec)
        except errors.AlreadyExists:
            view = api.clusters.get(name)
        view = clusters.wait_with_progress(api, name, "default", view.status.desired_nodes, timeout)
    _print_next_steps(url, view)


def _print_next_steps(url: str, view: state.ClusterView | None) -> None:
    out = output.console
    if view is not None:
        out.print(f"cluster [bold]{view.spec.name}[/bold]: {view.status.message}")
        out.print(f"  Ray dashboard  {url}/clusters/{view.spec.namespace}/{view.spec.name}/  (log in at {url}/login)")
    out.print(f"  credentials    {config.credentials_path()} (mode 0600)")
    try:
        info = Client(url).info()
    except errors.RaypodError:
        info = None
    if info is not None:
        out.print(f"  tenancy        {info.tenancy}", soft_wrap=True)
    out.print("\nNext steps:")
    if view is not None:
        out.print(
            f"  ray job submit --address raypod://{view.spec.name} --working-dir . -- python train.py",
            soft_wrap=True,
        )
    out.print("  raypod cluster list")
    out.print("  raypod cluster create demo --workers 2")
    out.print("  raypod token create          # a token for another machine or CI (RAYPOD_TOKEN)")
    out.print("  raypod down")


@app.command()
def down(
    keep_clusters: Annotated[bool, typer.Option("--keep-clusters", help="Keep the clusters running.")] = False,
    keep_monitoring: Annotated[
        bool, typer.Option("--keep-monitoring", help="Keep the Prometheus of 'raypod monitoring up' running.")
    ] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for each deletion.")] = 120.0,
) -> None:
    """Stop everything raypod started: every cluster, the Prometheus of 'monitoring up', then the server."""
    home = config.default_home()
    url = config.default_server_url()
    if not keep_monitoring:
        output.console.print(observability.stop_prometheus())
    if not keep_clusters and daemon.is_healthy(url, connection_settings(url).verify):
        # Closed before the server is told to stop: an open connection holds its graceful shutdown.
        with Client(url) as api:
            views = api.clusters.list()
            for view in views:
                api.clusters.delete(view.spec.name, view.spec.namespace)
            for view in views:
                api.clusters.wait_deleted(view.spec.name, view.spec.namespace, timeout=timeout)
                output.console.print(f"cluster {view.spec.namespace}/{view.spec.name} deleted")
    stopped = daemon.stop(home)
    output.console.print("raypod server stopped" if stopped else "no raypod server was running")


def main() -> None:
    app()
