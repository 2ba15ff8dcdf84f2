"""Single sign-on from the CLI and SDK: `raypod login` (the provider's device authorization flow, through raypod's
server, which alone holds the client secret) and refreshing its short-lived token before it expires, so the CLI,
the SDK and ``ray job submit --address raypod://...`` work with no token pasted anywhere."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from raypod import config, errors
from raypod.client._http import Transport

REFRESH_MARGIN = timedelta(seconds=60)  # refresh this long before the token expires


class Sso:
    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def info(self) -> dict[str, Any]:
        found: dict[str, Any] = self._t.request("GET", "/api/v1/sso")
        return found

    def begin_device_login(self) -> dict[str, Any]:
        found: dict[str, Any] = self._t.request("POST", "/api/v1/sso/device")
        return found

    def poll_device_login(self, device_code: str) -> dict[str, Any]:
        found: dict[str, Any] = self._t.request("POST", "/api/v1/sso/device/token", json={"device_code": device_code})
        return found

    def refresh(self, refresh_token: str) -> dict[str, Any]:
        found: dict[str, Any] = self._t.request("POST", "/api/v1/sso/refresh", json={"refresh_token": refresh_token})
        return found

    def device_login(
        self, show: Callable[[dict[str, Any]], None], sleep: Callable[[float], None] = time.sleep
    ) -> dict[str, Any]:
        """Start a device login, ``show`` its user code and URL, and poll until the user finished at the provider.

        Raises:
            Unauthenticated (denied or expired at the provider), Forbidden (in no group raypod maps), NotFound
            (the server has no single sign-on)."""
        started = self.begin_device_login()
        show(started)
        deadline = time.monotonic() + float(started["expires_in"])
        while time.monotonic() < deadline:
            sleep(float(started["interval"]))
            found = self.poll_device_login(started["device_code"])
            if found.get("status") == "signed-in":
                return found
        raise errors.Unauthenticated("the device login expired before it was finished at the provider; try again")


def save(path: Path, server: str, ca_file: str | None, signed_in: dict[str, Any]) -> None:
    config.write_credentials(
        path,
        server,
        signed_in["token"],
        ca_file,
        refresh_token=signed_in.get("refresh_token"),
        token_expires_at=signed_in.get("expires_at"),
    )


def fresh_credentials(stored: dict[str, str], server: str, verify: str | bool) -> dict[str, str]:
    """The stored credentials, refreshed through the server first when `raypod login` made them and their token
    expires within a minute; unchanged otherwise, or when the refresh is refused (the call then fails with the
    expired token's own clear error)."""
    refresh_token, expires = stored.get("refresh_token"), stored.get("token_expires_at")
    if not refresh_token or not expires:
        return stored
    try:
        ends = datetime.fromisoformat(expires)
    except ValueError:
        return stored
    if ends.tzinfo is None:
        ends = ends.replace(tzinfo=UTC)
    if ends - datetime.now(UTC) > REFRESH_MARGIN:
        return stored
    transport = Transport(server, 30.0, verify=verify)
    try:
        signed_in = Sso(transport).refresh(refresh_token)
    except errors.RaypodError:
        return stored
    finally:
        transport.close()
    save(config.credentials_path(), server, stored.get("ca_file"), signed_in)
    return config.read_credentials()
