"""``raypod://<cluster>[/<namespace>]`` addresses for Ray's job tooling, resolved through raypod's gateway.

Ray calls ``raypod.get_job_submission_client_cluster_info`` for such an address (``ray job submit --address
raypod://demo``, ``JobSubmissionClient("raypod://demo/team-a")``); requests then go to the gateway with the
user's raypod token, and the gateway adds the cluster's own Ray token.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

from raypod import errors, spec


def parse(address: str) -> tuple[str, str]:
    """``demo`` / ``demo/team-a`` -> (namespace, cluster).

    Raises:
        InvalidSpec: not a cluster[/namespace] pair of DNS-1123 labels.
    """
    parts = address.strip().strip("/").split("/")
    if not 1 <= len(parts) <= 2 or not all(spec.is_dns_label(p) for p in parts):
        raise errors.InvalidSpec(f"'raypod://{address}' is not raypod://<cluster>[/<namespace>]")
    cluster, namespace = parts[0], parts[1] if len(parts) == 2 else "default"
    return namespace, cluster


def cluster_info(address: str, headers: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
    """Return the gateway URL and headers for a raypod address, after checking the cluster is there.

    Raises:
        InvalidSpec, Unauthenticated (no credentials), ServerUnreachable, NotFound, Forbidden.
    """
    from raypod.client import Client, connection_settings

    namespace, cluster = parse(address)
    settings = connection_settings()
    if not settings.token:
        raise errors.Unauthenticated(
            "no raypod credentials: set RAYPOD_TOKEN (see 'raypod token create') or run 'raypod up' on this machine"
        )
    with Client(settings.server, token=settings.token) as client:
        client.clusters.get(cluster, namespace)
    if isinstance(settings.verify, str):
        _trust(Path(settings.verify))
    merged = {**(headers or {}), "Authorization": f"Bearer {settings.token}"}
    return f"{settings.server}/clusters/{namespace}/{cluster}", merged


def _trust(ca_file: Path) -> None:
    """Make Ray's HTTP clients (requests for REST, aiohttp for log tailing) trust raypod's certificate, in this
    process only: a bundle of the roots already in use plus raypod's CA."""
    import certifi

    roots = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("SSL_CERT_FILE") or certifi.where()
    digest = hashlib.sha256(f"{roots}:{ca_file}".encode()).hexdigest()[:12]
    bundle = Path(tempfile.gettempdir()) / f"raypod-ca-{os.getuid()}-{digest}.pem"
    bundle.write_text(Path(roots).read_text() + "\n" + ca_file.read_text())
    for variable in ("REQUESTS_CA_BUNDLE", "SSL_CERT_FILE", "RAYPOD_CA_BUNDLE"):
        os.environ[variable] = str(bundle)
    # aiohttp built its default TLS context when Ray imported it, before this hook ran: add the CA to it.
    # TODO(raypod, #3): drop once Ray passes `verify` through ClusterInfo.
    with contextlib.suppress(ImportError, AttributeError):
        from aiohttp import connector

        connector._SSL_CONTEXT_VERIFIED.load_verify_locations(cafile=str(ca_file))
