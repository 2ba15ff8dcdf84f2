"""The one place the SDK talks HTTP: errors come back as the raypod.errors classes the server raised."""

from __future__ import annotations

import ssl
from typing import Any

import httpx

from raypod import errors


def tls_verify(verify: str | bool) -> ssl.SSLContext | bool:
    """httpx's ``verify`` for a CA file path (raypod's self-signed certificate) or a plain on/off."""
    return ssl.create_default_context(cafile=verify) if isinstance(verify, str) else verify


class Transport:
    def __init__(
        self,
        server: str,
        timeout: float,
        http: httpx.Client | None = None,
        token: str | None = None,
        verify: str | bool = True,
    ) -> None:
        self.server = server.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._owns_http = http is None  # a client handed in is its giver's to close
        self._http = http or httpx.Client(base_url=self.server, timeout=timeout, verify=tls_verify(verify))
        self._http.headers.update(headers)

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """The JSON answer of a call. Raises the raypod.errors class the server raised, or ServerUnreachable."""
        response = self._send(method, path, **kwargs)
        return response.json() if response.content else None

    def request_text(self, method: str, path: str, **kwargs: Any) -> str:
        return self._send(method, path, **kwargs).text

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.ConnectError as exc:
            if "CERTIFICATE_VERIFY_FAILED" in str(exc):
                raise errors.ServerUnreachable(
                    f"the TLS certificate of {self.server} is not trusted; set RAYPOD_CA_FILE to its CA file "
                    "(raypod's own is $RAYPOD_HOME/tls/ca.crt)"
                ) from None
            raise errors.ServerUnreachable(
                f"cannot reach the raypod server at {self.server} ({type(exc).__name__}); "
                "start it with 'raypod up' or set RAYPOD_SERVER"
            ) from None
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
        return response

    def close(self) -> None:
        if self._owns_http:
            self._http.close()
