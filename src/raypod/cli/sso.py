"""``raypod login``: single sign-on from a terminal (the provider's device authorization flow)."""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer

from raypod import config
from raypod.cli import output
from raypod.client import Client, connection_settings
from raypod.client import sso as sso_client


def login(
    server: Annotated[
        str | None, typer.Option(help="The raypod server (default: RAYPOD_SERVER or the stored one).")
    ] = None,
) -> None:
    """Sign in with your organisation's identity provider: open the URL shown, enter the code, and the CLI, the
    SDK and `ray job submit --address raypod://...` use a short-lived token it refreshes through the provider."""
    settings = connection_settings(server=server, token="-")  # no credential is sent: the provider vouches
    ca_file = os.environ.get("RAYPOD_CA_FILE") or config.read_credentials().get("ca_file")

    def show(started: dict[str, Any]) -> None:
        url = started.get("verification_uri_complete") or started["verification_uri"]
        output.console.print(f"Open {url} and confirm the code [bold]{started['user_code']}[/bold].", highlight=False)
        output.console.print("Waiting for you to finish there...", style="dim")

    with Client(settings.server, token=None, verify=settings.verify) as api:
        api.request("GET", "/healthz")
        signed_in = api.sso.device_login(show)
    sso_client.save(config.credentials_path(), settings.server, ca_file, signed_in)
    output.console.print(
        f"Signed in as [bold]{signed_in['user']}[/bold]; credentials in {config.credentials_path()} (mode 0600)",
        highlight=False,
    )
