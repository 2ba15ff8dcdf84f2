"""``raypod monitoring up|down|status|dashboards|grafana-sync``: Prometheus, dashboards, Grafana."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from raypod import config, errors
from raypod.cli import clusters, output
from raypod.client import connection_settings

app = typer.Typer(help="Prometheus for every cluster, Grafana dashboards.", no_args_is_help=True)


@app.command("up")
def up(
    port: Annotated[int, typer.Option(help="Prometheus port on 127.0.0.1 (Ray's dashboard expects 9090).")] = 9090,
    scrape_interval: Annotated[str, typer.Option(help="How often every node is scraped.")] = "5s",
) -> None:
    """Start Prometheus: it discovers every node of every cluster through raypod and labels each series with
    its cluster (ray_io_cluster); Ray dashboards of heads started from now on chart from it."""
    from raypod.capabilities.observability import local_prometheus

    home = config.default_home()
    running = local_prometheus.read(home)
    if running is not None:
        output.console.print(f"Prometheus already runs at {running.url} (pid {running.pid})")
        return
    local_prometheus.binary()
    api = clusters.client()
    created = api.tokens.create("prometheus", ttl_seconds=None)
    verify = connection_settings().verify
    ca = verify if isinstance(verify, str) else None
    try:
        running = local_prometheus.start(
            home,
            api.server,
            created.token,
            created.id,
            Path(ca) if ca and api.server.startswith("https") else None,
            port=port,
            scrape_interval=scrape_interval,
        )
    except errors.RaypodError:
        api.tokens.revoke(created.id)
        raise
    output.console.print(f"Prometheus runs at {running.url} (pid {running.pid}); config {running.config}")
    output.console.print("Targets appear within seconds: 'raypod monitoring status'.")


@app.command("down")
def down() -> None:
    """Stop Prometheus (its data stays under $RAYPOD_HOME/monitoring) and revoke its token."""
    output.console.print(stop_prometheus())


def stop_prometheus() -> str:
    """Stop the Prometheus of ``monitoring up`` and revoke its token; returns what happened, in a line."""
    from raypod.capabilities.observability import local_prometheus

    stopped = local_prometheus.stop(config.default_home())
    if stopped is None:
        return "Prometheus was not running"
    try:
        with clusters.client() as api:
            api.tokens.revoke(stopped.token_id)
    except errors.RaypodError as exc:
        return f"Prometheus stopped; its token was not revoked: {exc.message}"
    return f"Prometheus stopped (pid {stopped.pid}); its token is revoked"


@app.command("status")
def status() -> None:
    """Where Prometheus runs and the health of its targets, per cluster."""
    from raypod.capabilities.observability import local_prometheus

    running = local_prometheus.read(config.default_home())
    if running is None:
        output.console.print("Prometheus is not running: 'raypod monitoring up' starts it")
        raise typer.Exit(1)
    output.console.print(f"Prometheus at {running.url} (pid {running.pid})")
    for target in sorted(
        local_prometheus.targets(running.url, local_prometheus.credentials(config.default_home())),
        key=lambda t: (t["labels"].get("job", ""), t["labels"].get("ray_io_cluster", ""), t["scrapeUrl"]),
    ):
        labels = target["labels"]
        where = f"{labels.get('namespace', '')}/{labels.get('ray_io_cluster', '')} {labels.get('node', '')}".strip()
        error = f"  {target['lastError']}" if target.get("lastError") else ""
        output.console.print(f"  {labels.get('job')}: {target['health']:<7} {where if where != '/' else ''} {error}")


@app.command("dashboards")
def dashboards(
    out: Annotated[Path, typer.Option("--out", help="Folder for dashboards/ and Grafana provisioning/.")],
    prometheus_url: Annotated[str | None, typer.Option(help="The datasource URL (default: the running one).")] = None,
    check: Annotated[bool, typer.Option(help="Run every expression through that Prometheus.")] = False,
) -> None:
    """Write Ray Core/Data/Train/Serve dashboards (from Ray's own generator, filterable by cluster), the raypod
    overview, and Grafana provisioning files."""
    from raypod.capabilities.observability import dashboards as dashboards_mod

    endpoints = config.MonitoringEndpoints.read(config.default_home())
    url = prometheus_url or endpoints.prometheus_url
    written = dashboards_mod.write(out, url or "http://127.0.0.1:9090", endpoints.prometheus_auth)
    for path in written:
        output.console.print(str(path))
    if not check:
        return
    if not url:
        raise errors.Conflict("--check needs a running Prometheus: 'raypod monitoring up' or --prometheus-url")
    from raypod.capabilities.observability import prometheus

    client = prometheus.PrometheusClient(url, auth=endpoints.prometheus_auth)
    try:
        everything = dashboards_mod.all_dashboards()
        refused = dashboards_mod.check(client.query, everything)
    finally:
        client.close()
    total = sum(len(dashboards_mod.expressions(d)) for d in everything.values())
    for refusal in refused:
        output.console.print(f"{refusal.dashboard} / {refusal.panel}: {refusal.error}\n  {refusal.expr}")
    output.console.print(f"{total - len(refused)} of {total} expressions accepted by Prometheus at {url}")
    if refused:
        raise typer.Exit(1)


@app.command("grafana-sync")
def grafana_sync(
    url: Annotated[str, typer.Option(help="Grafana's URL, e.g. https://grafana.example.org")],
    token: Annotated[str, typer.Option(help="A Grafana service-account token.", envvar="GRAFANA_TOKEN")],
    prometheus_url: Annotated[
        str | None, typer.Option(help="Also create a Prometheus datasource with this URL if missing.")
    ] = None,
) -> None:
    """Create or update the dashboards in a "Ray" folder of an existing Grafana, through its HTTP API."""
    from raypod.capabilities.observability import dashboards as dashboards_mod
    from raypod.capabilities.observability import grafana

    auth = config.MonitoringEndpoints.read(config.default_home()).prometheus_auth
    for synced in grafana.sync(url, token, dashboards_mod.all_dashboards(), prometheus_url, prometheus_auth=auth):
        output.console.print(f"{synced.title}: {synced.url}")
