"""A real OpenID Connect provider for the tests: panva's certified ``oidc-provider`` on Node.js
(``tests/sso/provider.mjs``; `npm ci` in tests/sso installs it, as scripts/test.sh does)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from joserfc.jwk import RSAKey

HERE = Path(__file__).parent
NODE = shutil.which("node") or "/usr/bin/node"
# CI sets RAYPOD_FAIL_ON_SKIP: a missing provider then fails the run instead of skipping its tests.
MISSING = not (HERE / "node_modules" / "oidc-provider").exists() or not Path(NODE).exists()
CLIENT_ID = "raypod"
GROUPS = {
    "ml-engineers": {"team": "ml"},
    "ml-leads": {"team": "ml", "role": "admin"},
    "platform": {"installation_admin": True},
}


def signing_key(kid: str) -> RSAKey:
    return RSAKey.generate_key(2048, parameters={"kid": kid, "use": "sig", "alg": "RS256"}, private=True)


@dataclass
class OidcProvider:
    folder: Path
    port: int
    raypod_url: str  # where raypod answers: the redirect and back-channel logout URIs
    secret: str = "test-client-secret-0123456789"
    process: subprocess.Popen[bytes] | None = None
    keys: list[RSAKey] = field(default_factory=lambda: [signing_key("key-1")])

    @property
    def issuer(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def raypod_env(self) -> dict[str, str]:
        """What the raypod server needs to use this provider (docs/sso.md)."""
        secret_file = self.folder / "client-secret"
        secret_file.write_text(self.secret)
        secret_file.chmod(0o600)
        return {
            "RAYPOD_SSO_ISSUER": self.issuer,
            "RAYPOD_SSO_CLIENT_ID": CLIENT_ID,
            "RAYPOD_SSO_CLIENT_SECRET_FILE": str(secret_file),
            "RAYPOD_SSO_GROUPS": json.dumps(GROUPS),
            "RAYPOD_SSO_NAME": "Test IdP",
        }

    def set_accounts(self, accounts: dict[str, list[str]]) -> None:
        """Who can log in and their groups (read by the provider at each login and refresh)."""
        path = self.folder / "accounts.json"
        path.write_text(json.dumps({name: {"groups": groups} for name, groups in accounts.items()}))

    def start(self, ca_file: str | None = None) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        if not (self.folder / "accounts.json").exists():
            self.set_accounts({})
        (self.folder / "jwks.json").write_text(json.dumps({"keys": [k.as_dict(private=True) for k in self.keys]}))
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PORT": str(self.port),
            "ISSUER": self.issuer,
            "CLIENT_ID": CLIENT_ID,
            "CLIENT_SECRET": self.secret,
            "REDIRECT_URI": f"{self.raypod_url}/login/sso/callback",
            "BACKCHANNEL_LOGOUT_URI": f"{self.raypod_url}/login/sso/backchannel-logout",
            "ACCOUNTS_FILE": str(self.folder / "accounts.json"),
            "JWKS_FILE": str(self.folder / "jwks.json"),
        }
        if ca_file:
            env["NODE_EXTRA_CA_CERTS"] = ca_file  # raypod's own CA, for the back-channel logout call
        with open(self.folder / "provider.log", "ab") as log:
            self.process = subprocess.Popen(
                [NODE, str(HERE / "provider.mjs")], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=HERE
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                httpx.get(f"{self.issuer}/.well-known/openid-configuration", timeout=2).raise_for_status()
                return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError(f"the OIDC provider did not start:\n{(self.folder / 'provider.log').read_text()[-2000:]}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)

    def rotate_keys(self, ca_file: str | None = None) -> None:
        """Restart with a new signing key (the old one is no longer published): what a provider's rotation looks
        like to its clients once the old key is retired."""
        self.stop()
        self.keys = [signing_key(f"key-{len(self.keys) + 1}")]
        self.start(ca_file)
