"""Every cluster's and workspace's proxied pages on an origin of their own, never on the console's.

A Ray dashboard, a Serve app or a workspace's IDE serves pages that its cluster's users wrote or can change. On
the console's origin such a page would run with whoever opens it's console session (read the CSRF token, make an
admin). So browsers reach them at ``https://<name>--<namespace>.<domain>:<port>/`` (a workspace:
``<name>--<namespace>--ws.<domain>``), served by the same listener; on a laptop the domain is ``localhost``,
whose subdomains browsers resolve to loopback. Browsers keep cookies apart by host, not by port, so a second port
would not do.

A browser enters an origin from the console: the console's gateway path (``/clusters/<ns>/<name>/...``,
``/spaces/<ns>/<name>/...``) answers a browser session with a redirect carrying a one-time ticket (60 s) to
``/_raypod/enter`` on the origin, which sets a short-lived cookie for that one origin (host-only, HttpOnly,
``__Host-`` over TLS) naming the console session by its stored hash, signed with the server's secret. The
session's end (logout, its token revoked) ends the origin's access at the next request. Plain Ray tooling
(``raypod://``, bearer tokens) keeps using the console's gateway paths: what is proxied there carries
``Content-Security-Policy: sandbox``, so even a page rendered there runs on no origin at all.

Names that a host label cannot carry (a namespace with ``--``, a label over 63 characters) have no origin of
their own: a browser is refused there rather than served on the console's origin.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from raypod import spec as spec_mod

ENTER_PATH = "/_raypod/enter"
TICKET_TTL_S = 60.0
COOKIE_TTL_S = 8 * 3600
SECRET_FILE = "origin-secret"
SPACE_SUFFIX = "ws"
# What proxied pages on their own origin get: no MIME sniffing, and no framing by another site (clickjacking).
ORIGIN_HEADERS = {"x-content-type-options": "nosniff", "content-security-policy": "frame-ancestors 'self'"}
# What anything proxied on the console's origin gets (tools and API clients): a page there runs sandboxed, on
# an opaque origin, without scripts.
CONSOLE_HEADERS = {"x-content-type-options": "nosniff", "content-security-policy": "sandbox"}


@dataclass(frozen=True)
class Target:
    kind: Literal["cluster", "space"]
    namespace: str
    name: str

    @property
    def label(self) -> str | None:
        """The host label, or None where the names cannot make one that parses back."""
        if "--" in self.namespace:
            return None
        label = f"{self.name}--{self.namespace}" + (f"--{SPACE_SUFFIX}" if self.kind == "space" else "")
        return label if len(label) <= 63 else None

    @property
    def console_path(self) -> str:
        return f"/{'clusters' if self.kind == 'cluster' else 'spaces'}/{self.namespace}/{self.name}/"


def parse_label(label: str) -> Target | None:
    parts = label.split("--")
    if len(parts) >= 3 and parts[-1] == SPACE_SUFFIX:
        target = Target("space", parts[-2], "--".join(parts[:-2]))
    elif len(parts) >= 2:
        target = Target("cluster", parts[-1], "--".join(parts[:-1]))
    else:
        return None
    for value in (target.namespace, target.name):
        if not spec_mod.is_dns_label(value):
            return None
    return target if target.label == label else None


class Origins:
    """Which host is whose origin, the tickets that enter one, and the cookies that stay there."""

    def __init__(self, domain: str, secret: bytes, secure: bool) -> None:
        self.domain = domain.lower().strip(".")
        self._secret = secret
        self.secure = secure
        self.cookie_name = "__Host-raypod_origin" if secure else "raypod_origin"
        self._tickets: dict[str, tuple[Target, str, float]] = {}
        self._lock = threading.Lock()

    @classmethod
    def load(cls, home: Path, domain: str, secure: bool) -> Origins:
        """With the server's origin secret (0600 in ``home``, made once): cookies outlive a restart."""
        path = home / SECRET_FILE
        try:
            secret = bytes.fromhex(path.read_text().strip())
        except (OSError, ValueError):
            secret = secrets.token_bytes(32)
            path.touch(mode=0o600)
            path.write_text(secret.hex())
        return cls(domain, secret, secure)

    def target_of(self, host: str) -> Target | None:
        """The cluster or workspace whose origin ``host`` (a Host header, port included or not) is."""
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        name = name.lower().rstrip(".")
        suffix = "." + self.domain
        if not name.endswith(suffix):
            return None
        label = name[: -len(suffix)]
        return parse_label(label) if label and "." not in label else None

    def url(self, target: Target, scheme: str, port: int | None) -> str | None:
        label = target.label
        if label is None:
            return None
        return f"{scheme}://{label}.{self.domain}" + (f":{port}" if port else "")

    # -- tickets: from the console to an origin, once ---------------------------------------------------------

    def issue(self, target: Target, session_hash: str) -> str:
        ticket = secrets.token_urlsafe(24)
        now = time.monotonic()
        with self._lock:
            for key in [k for k, (_, _, ends) in self._tickets.items() if ends <= now]:
                del self._tickets[key]
            self._tickets[ticket] = (target, session_hash, now + TICKET_TTL_S)
        return ticket

    def redeem(self, ticket: str, target: Target) -> str | None:
        """The session hash of a live ticket issued for ``target``; a ticket is used once."""
        with self._lock:
            found = self._tickets.pop(ticket[:64], None)
        if found is None or found[0] != target or found[2] <= time.monotonic():
            return None
        return found[1]

    # -- the origin's cookie ----------------------------------------------------------------------------------

    def cookie(self, target: Target, session_hash: str) -> str:
        payload = json.dumps({"t": target.label, "s": session_hash, "e": int(time.time() + COOKIE_TTL_S)})
        encoded = base64.urlsafe_b64encode(payload.encode()).decode().rstrip("=")
        return f"{encoded}.{self._sign(encoded)}"

    def session_of(self, value: str, target: Target) -> str | None:
        """The session hash a cookie names, if it is ours, unexpired, and for this very origin."""
        encoded, _, signature = value.partition(".")
        if not signature or not hmac.compare_digest(signature, self._sign(encoded)):
            return None
        try:
            data = json.loads(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)))
        except ValueError:
            return None
        if not isinstance(data, dict) or data.get("t") != target.label or not isinstance(data.get("s"), str):
            return None
        if not isinstance(data.get("e"), int) or data["e"] <= time.time():
            return None
        return str(data["s"])

    def _sign(self, encoded: str) -> str:
        return hmac.new(self._secret, encoded.encode(), hashlib.sha256).hexdigest()[:43]
