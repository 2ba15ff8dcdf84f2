"""A Prometheus for raypod: its generated configuration (pure) and the PromQL client the server's chart
endpoint uses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from raypod import errors

SCRAPE_INTERVAL = "5s"
SD_REFRESH = "5s"


def config(
    server_url: str, token_file: Path, ca_file: Path | None, scrape_interval: str = SCRAPE_INTERVAL
) -> dict[str, Any]:
    """``prometheus.yml`` that discovers every Ray node and raypod itself through raypod's HTTP service discovery.

    Both discovery and raypod's ``/metrics`` authenticate with the token in ``token_file`` (0600); Ray's node
    exporters are plain HTTP on the nodes' addresses.
    """
    authorization = {"type": "Bearer", "credentials_file": str(token_file)}
    tls = {"ca_file": str(ca_file)} if ca_file else {}

    def discovery(job: str) -> dict[str, Any]:
        sd: dict[str, Any] = {
            "url": f"{server_url}/api/v1/monitoring/sd?job={job}",
            "refresh_interval": SD_REFRESH,
            "authorization": authorization,
        }
        if tls:
            sd["tls_config"] = tls
        return sd

    raypod_job: dict[str, Any] = {
        "job_name": "raypod",
        "scheme": server_url.split("://", 1)[0],
        "metrics_path": "/metrics",
        "authorization": authorization,
        "http_sd_configs": [discovery("raypod")],
    }
    if tls:
        raypod_job["tls_config"] = tls
    return {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "scrape_configs": [
            {"job_name": "ray", "http_sd_configs": [discovery("ray")]},
            raypod_job,
        ],
    }


class PrometheusClient:
    """Instant and range queries against the HTTP API; every failure is a RaypodError with Prometheus' words."""

    def __init__(self, url: str, http: httpx.Client | None = None, auth: tuple[str, str] | None = None) -> None:
        self.url = url.rstrip("/")
        self.http = http or httpx.Client(timeout=10, auth=auth)

    def query(self, expr: str) -> list[dict[str, Any]]:
        return self._get("/api/v1/query", {"query": expr})

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        return self._get("/api/v1/query_range", {"query": expr, "start": start, "end": end, "step": step})

    def _get(self, path: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        try:
            response = self.http.get(self.url + path, params=params)
        except httpx.HTTPError as exc:
            raise errors.TransientError(
                f"Prometheus at {self.url} is not answering ({type(exc).__name__}); see 'raypod monitoring status'"
            ) from None
        try:
            body = response.json()
        except ValueError:
            raise errors.TransientError(f"Prometheus answered {response.status_code} without JSON") from None
        if body.get("status") != "success":
            raise errors.InvalidSpec(f"Prometheus refused the query: {body.get('error', response.text[:300])}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def close(self) -> None:
        self.http.close()
