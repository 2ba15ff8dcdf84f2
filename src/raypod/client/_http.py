"""The one place the SDK talks HTTP: errors come back as the raypod.errors classes the server raised."""

from __future__ import annotations

from typing import Any

import httpx

from raypod import errors


class Transport:
    def __init__(self, server: str, timeout: float, http: httpx.Client | None = None) -> None:
        self.server = server.rstrip("/")
        self._http = http or httpx.Client(base_url=self.server, timeout=timeout)

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise errors.ServerUnreachable(
                f"cannot reach the raypod server at {self.server} ({type(exc).__name__}); "
                "start it with 'raypod up' or set RAYPOD_SERVER"
            ) from None
        if response.status_code >= 400:
            try:
                payload = response.json()
            except ValueError:
                payload = {"message": response.text[:200] or f"HTTP {response.status_code}"}
            raise errors.from_payload(payload if isinstance(payload, dict) else {}, response.status_code)
        return response.json() if response.content else None

    def close(self) -> None:
        self._http.close()
