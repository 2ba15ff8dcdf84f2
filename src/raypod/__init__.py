"""raypod: Ray clusters without YAML.

This module stays light on purpose: Ray imports it to resolve ``raypod://`` job-submission addresses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from raypod.client import Client


def __getattr__(name: str) -> Any:
    if name == "Client":
        from raypod.client import Client

        return Client
    raise AttributeError(f"module 'raypod' has no attribute {name!r}")


def get_job_submission_client_cluster_info(
    address: str,
    *,
    create_cluster_if_needed: bool | None = False,
    cookies: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
    headers: dict[str, Any] | None = None,
    **kwargs: Any,
) -> Any:
    """Ray's job-submission address hook for ``raypod://<cluster>[/<namespace>]`` (see raypod.client.addresses)."""
    from ray.dashboard.modules.dashboard_sdk import ClusterInfo

    from raypod import errors
    from raypod.client import addresses

    try:
        url, merged = addresses.cluster_info(address, headers)
    except errors.RaypodError as exc:
        _raise_for_ray(exc.message)
    return ClusterInfo(address=url, cookies=cookies, metadata=metadata, headers=merged)


def _raise_for_ray(message: str) -> Any:
    """Raise what Ray's CLI prints as one line (a click error), which SDK users catch like any exception."""
    import click

    raise click.ClickException(f"raypod: {message}")


__all__ = ["Client", "__version__", "get_job_submission_client_cluster_info"]
