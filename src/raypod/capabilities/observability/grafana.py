"""Push raypod's dashboards into an existing Grafana through its HTTP API (folders, datasources, dashboards)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from raypod import errors
from raypod.capabilities.observability import dashboards as dashboards_mod


@dataclass(frozen=True)
class Synced:
    title: str
    url: str


def sync(
    url: str,
    token: str,
    dashboards: dict[str, dict[str, Any]],
    prometheus_url: str | None = None,
    http: httpx.Client | None = None,
    prometheus_auth: tuple[str, str] | None = None,
) -> list[Synced]:
    """Create the "Ray" folder (and a Prometheus datasource when ``prometheus_url`` is given) if missing, then
    create or overwrite every dashboard in it. Idempotent.

    Raises:
        Unauthenticated: Grafana refused the token. ServerUnreachable: no Grafana at ``url``.
        InvalidSpec: Grafana refused a request (its message is kept).
    """
    client = http or httpx.Client(timeout=30)
    base = url.rstrip("/")
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def call(method: str, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
        try:
            response = client.request(method, base + path, headers=headers, json=body)
        except httpx.HTTPError as exc:
            raise errors.ServerUnreachable(f"no Grafana answers at {base} ({type(exc).__name__})") from None
        if response.status_code in (401, 403):
            raise errors.Unauthenticated(f"Grafana at {base} refused the token ({response.status_code})")
        return response

    def check(response: httpx.Response, what: str) -> dict[str, Any]:
        if response.status_code >= 400:
            raise errors.InvalidSpec(f"Grafana refused {what} ({response.status_code}): {response.text[:300]}")
        body: dict[str, Any] = response.json() if response.content else {}
        return body

    try:
        if call("GET", f"/api/folders/{dashboards_mod.FOLDER_UID}").status_code == 404:
            folder = {"uid": dashboards_mod.FOLDER_UID, "title": dashboards_mod.FOLDER_TITLE}
            check(call("POST", "/api/folders", folder), "the Ray folder")
        if prometheus_url and call("GET", f"/api/datasources/uid/{dashboards_mod.DATASOURCE_UID}").status_code == 404:
            source = {
                "name": "Prometheus (raypod)",
                "uid": dashboards_mod.DATASOURCE_UID,
                "type": "prometheus",
                "access": "proxy",
                "url": prometheus_url,
                **dashboards_mod.datasource_auth(prometheus_auth),
            }
            check(call("POST", "/api/datasources", source), "the Prometheus datasource")
        synced = []
        for dashboard in dashboards.values():
            body = {
                "dashboard": {**dashboard, "id": None},
                "folderUid": dashboards_mod.FOLDER_UID,
                "overwrite": True,
                "message": "raypod monitoring grafana-sync",
            }
            result = check(call("POST", "/api/dashboards/db", body), f"dashboard '{dashboard.get('title')}'")
            synced.append(Synced(title=str(dashboard.get("title")), url=base + str(result.get("url", ""))))
        return synced
    finally:
        if http is None:
            client.close()
