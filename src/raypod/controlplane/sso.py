"""Single sign-on with the organisation's OpenID Connect provider: the console's authorization code flow (PKCE,
``state``, ``nonce``), the CLI's device authorization flow, refresh through the provider, and back-channel logout.

Every way in ends the same: an ID token verified here (signature from the provider's JWKS, refetched when an
unknown key id appears, so a key rotation needs nothing; issuer, audience, expiry and issue time with a little clock
skew; the nonce where one was sent), its groups mapped to teams and roles (``RAYPOD_SSO_GROUPS``), the user made or
updated in the same transaction, and a short-lived raypod token minted for it and remembered with the provider
session it came from. Everything else (sessions, the gateway, ``raypod://`` addresses) takes that token as any other.
The protocol is Authlib's; the JOSE work is joserfc's (Authlib's own successor to ``authlib.jose``).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
import time
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

import httpx
from authlib.common.security import generate_token
from authlib.integrations.base_client import OAuthError
from authlib.integrations.httpx_client import OAuth2Client
from joserfc import errors as jose_errors
from joserfc import jws, jwt
from joserfc.jwk import KeySet

from raypod import config, errors, state
from raypod.controlplane import store
from raypod.controlplane.identity import IdentityService, Principal
from raypod.controlplane.store.sso import PendingLogin, SsoStore

# Asymmetric algorithms only: an HS256 ID token would be signed with the client secret, "none" with nothing.
ID_TOKEN_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
BACKCHANNEL_EVENT = "http://schemas.openid.net/event/backchannel-logout"
DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
METADATA_TTL_S = 3600.0
JWKS_REFETCH_MIN_S = 2.0  # an unknown key id refetches the JWKS at most this often (no refetch storm)


def _hash(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


@dataclass(frozen=True)
class SignedIn:
    """What a completed sign-in gives: the raypod token minted for it (and, for the CLI, the provider's refresh
    token, which only raypod's server can use: it needs the client secret)."""

    principal: Principal
    token: state.CreatedToken
    refresh_token: str | None
    next_url: str = "/"


@dataclass(frozen=True)
class DeviceLogin:
    device_code: str
    user_code: str
    verification_uri: str
    verification_uri_complete: str | None
    expires_in: int
    interval: int


class ProviderKeys:
    """The provider's discovery document and signing keys, cached; an unknown ``kid`` refetches the keys."""

    def __init__(self, settings: config.SsoSettings, http: httpx.Client) -> None:
        self.settings = settings
        self.http = http
        self._metadata: dict[str, Any] | None = None
        self._metadata_at = 0.0
        self._keys: KeySet | None = None
        # When an unknown kid last made it fetch the keys again: tokens naming kids the provider does not have
        # refetch at most every JWKS_REFETCH_MIN_S; the first fetch does not count (a rotation may follow it).
        self._refetched_at = float("-inf")
        self._lock = threading.RLock()  # the keys' URL comes from the discovery document, read under it too

    def metadata(self) -> dict[str, Any]:
        with self._lock:
            if self._metadata is None or time.monotonic() - self._metadata_at > METADATA_TTL_S:
                url = f"{self.settings.issuer}/.well-known/openid-configuration"
                found = self._get_json(url, "discovery document")
                if str(found.get("issuer", "")).rstrip("/") != self.settings.issuer:
                    raise errors.TransientError(
                        f"the provider's discovery document names issuer {str(found.get('issuer'))[:100]!r}, "
                        f"not {self.settings.issuer!r}"
                    )
                self._metadata, self._metadata_at = found, time.monotonic()
            return self._metadata

    def endpoint(self, name: str) -> str:
        url = self.metadata().get(name)
        if not isinstance(url, str) or not url:
            raise errors.Conflict(f"the single sign-on provider offers no {name.replace('_', ' ')}")
        return url

    def key_set(self, kid: str | None) -> KeySet:
        with self._lock:
            unknown = self._keys is not None and kid is not None and not _has_kid(self._keys, kid)
            if unknown and time.monotonic() - self._refetched_at > JWKS_REFETCH_MIN_S:
                self._refetched_at = time.monotonic()
            elif self._keys is not None:
                return self._keys
            self._keys = KeySet.import_key_set(self._get_json(self._jwks_uri(), "signing keys"))  # type: ignore[arg-type]
            assert self._keys is not None
            return self._keys

    def _jwks_uri(self) -> str:
        uri = self._metadata.get("jwks_uri") if self._metadata else None
        return str(uri) if uri else self.endpoint("jwks_uri")

    def _get_json(self, url: str, what: str) -> dict[str, Any]:
        try:
            response = self.http.get(url)
            response.raise_for_status()
            found = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise errors.TransientError(
                f"the single sign-on provider's {what} cannot be read from {url[:200]} ({type(exc).__name__})"
            ) from None
        if not isinstance(found, dict):
            raise errors.TransientError(f"the single sign-on provider's {what} is not a JSON object")
        return found


def _has_kid(keys: KeySet, kid: str) -> bool:
    return any(key.kid == kid for key in keys.keys)


def verify_jwt(
    keys: ProviderKeys,
    token: str,
    *,
    nonce: str | None = None,
    logout: bool = False,
    now: float | None = None,
) -> dict[str, Any]:
    """The claims of an ID token (or, ``logout``, a back-channel logout token) the provider signed for raypod.

    Raises:
        Unauthenticated: a bad signature or algorithm, an unknown key, the wrong issuer or audience, expired or
        issued in the future (past the leeway), the wrong nonce; what is wrong is said, never the token.
    """
    settings = keys.settings
    what = "logout token" if logout else "ID token"
    try:
        header = jws.extract_compact(token.encode()).protected
    except (jose_errors.JoseError, ValueError, UnicodeError):
        raise errors.Unauthenticated(f"the {what} is malformed") from None
    algorithm = header.get("alg")
    if algorithm not in ID_TOKEN_ALGORITHMS:
        raise errors.Unauthenticated(f"the {what} is signed with {str(algorithm)[:20]!r}, which raypod refuses")
    key_set = keys.key_set(header.get("kid"))
    try:
        claims = dict(jwt.decode(token, key_set, algorithms=[algorithm]).claims)
    except (jose_errors.BadSignatureError, jose_errors.MissingKeyError, ValueError):
        raise errors.Unauthenticated(f"the {what}'s signature is not the provider's") from None
    except jose_errors.JoseError as exc:
        raise errors.Unauthenticated(f"the {what} cannot be verified ({type(exc).__name__})") from None
    checks: dict[str, Any] = {
        "iss": {"essential": True, "value": settings.issuer},
        "sub": {"essential": not logout},
        "iat": {"essential": True},
    }
    if not logout:
        checks["exp"] = {"essential": True}
    registry = jwt.JWTClaimsRegistry(now=int(now) if now is not None else None, leeway=settings.leeway_s, **checks)
    try:
        registry.validate(claims)
    except jose_errors.ExpiredTokenError:
        raise errors.Unauthenticated(f"the {what} has expired") from None
    except jose_errors.InvalidTokenError:
        raise errors.Unauthenticated(f"the {what} is not valid yet (issued in the future)") from None
    except jose_errors.JoseError as exc:
        claim = getattr(exc, "claim", "")
        raise errors.Unauthenticated(f"the {what}'s {claim or 'claims'} are not what raypod expects") from None
    issued = claims.get("iat")
    moment = time.time() if now is None else now
    if isinstance(issued, (int, float)) and issued > moment + settings.leeway_s:
        raise errors.Unauthenticated(f"the {what} is not valid yet (issued in the future)")
    audience = claims.get("aud")
    audiences = audience if isinstance(audience, list) else [audience]
    if settings.client_id not in audiences or (len(audiences) > 1 and claims.get("azp") != settings.client_id):
        raise errors.Unauthenticated(f"the {what} was issued for another application (audience)")
    if nonce is not None and not hmac.compare_digest(str(claims.get("nonce", "")), nonce):
        raise errors.Unauthenticated(f"the {what}'s nonce is not this login's")
    if logout:
        events = claims.get("events")
        if not isinstance(events, dict) or BACKCHANNEL_EVENT not in events or "nonce" in claims:
            raise errors.Unauthenticated("not a back-channel logout token")
        if not claims.get("sid") and not claims.get("sub"):
            raise errors.Unauthenticated("the logout token names neither a session nor a subject")
    return claims


def user_name(claims: dict[str, Any], claim: str) -> str:
    """A raypod user name (a DNS-1123 label) from the provider's claim: ``Jane.Doe@example.com`` -> ``jane-doe``
    for an e-mail address, lowercased with other characters made ``-``.

    Raises:
        Forbidden: the claim is missing or leaves nothing usable."""
    raw = claims.get(claim)
    if not isinstance(raw, str) or not raw.strip():
        raise errors.Forbidden(
            f"the provider's ID token has no '{claim}' claim to name you by (RAYPOD_SSO_USERNAME_CLAIM)"
        )
    local = raw.strip().lower().split("@", 1)[0]
    name = re.sub(r"[^a-z0-9]+", "-", local).strip("-")[:63].strip("-")
    if not name:
        raise errors.Forbidden(f"the provider's '{claim}' claim gives no usable user name")
    return name


def grants(settings: config.SsoSettings, claims: dict[str, Any]) -> tuple[bool | None, dict[str, state.Role]]:
    """(installation admin: None when the mapping names no such group, team -> role) from the groups claim."""
    found = claims.get(settings.groups_claim) or []
    groups = {found} if isinstance(found, str) else {str(g) for g in found} if isinstance(found, list) else set()
    maps_admin = any(g.installation_admin for gs in settings.groups.values() for g in gs)
    is_admin: bool | None = False if maps_admin else None
    roles: dict[str, state.Role] = {}
    for group in sorted(groups & set(settings.groups)):
        for grant in settings.groups[group]:
            if grant.installation_admin:
                is_admin = True
            elif grant.team is not None:
                role = state.Role(grant.role)
                roles[grant.team] = state.Role.ADMIN if state.Role.ADMIN in (role, roles.get(grant.team)) else role
    return is_admin, roles


class SsoService:
    def __init__(
        self,
        db: store.Store,
        identities: IdentityService,
        settings: config.SsoSettings,
        redirect_url: str,
        http: httpx.Client | None = None,
    ) -> None:
        self.settings = settings
        self.identities = identities
        self.records = SsoStore(db.engine)
        self.redirect_url = settings.redirect_url or redirect_url
        self.http = http or httpx.Client(timeout=10.0, follow_redirects=False)
        self.keys = ProviderKeys(settings, self.http)

    # -- the console: authorization code flow with PKCE ----------------------------------------------------------

    def begin_login(self, next_url: str) -> tuple[str, str]:
        """(the provider's authorization URL to send the browser to, a binding for the browser's cookie): the
        callback is accepted only from the browser that began the login, once, within 10 minutes."""
        login_state, nonce, binding = generate_token(32), generate_token(32), secrets.token_urlsafe(32)
        verifier = generate_token(64)
        with self._oauth() as client:
            url, _ = client.create_authorization_url(
                self.keys.endpoint("authorization_endpoint"),
                state=login_state,
                nonce=nonce,
                code_verifier=verifier,
                scope=self.settings.scopes,
            )
        self.records.insert_pending(_hash(login_state), PendingLogin(_hash(binding), nonce, verifier, next_url))
        return str(url), binding

    def finish_login(self, login_state: str, code: str, binding: str | None) -> SignedIn:
        """The provider sent the browser back: check the login is this browser's, exchange the code (with the
        PKCE verifier), verify the ID token (with the nonce), sign the user in for ``session_ttl``.

        Raises:
            Unauthenticated (an unknown, used, expired or other browser's login; a refused token), Forbidden (no
            group raypod maps), Conflict (the user name belongs to someone else), TransientError (the provider)."""
        pending = self.records.take_pending(_hash(login_state))
        if pending is None or not binding or not hmac.compare_digest(pending.binding_hash, _hash(binding)):
            raise errors.Unauthenticated(
                "this sign-in is unknown, expired, already used or another browser's; start again"
            )
        tokens = self._token_request(
            code=code,
            grant_type="authorization_code",
            redirect_uri=self.redirect_url,
            code_verifier=pending.code_verifier,
        )
        claims = verify_jwt(self.keys, self._id_token(tokens), nonce=pending.nonce)
        signed = self.sign_in(claims, "sso-console", self.settings.session_ttl, None)
        return replace(signed, next_url=pending.next_url)

    def sign_out(self, token_id: str | None, back_to: str) -> str | None:
        """A console session single sign-on began has ended: its token goes too (nothing else holds it), and the
        browser is to end its session at the provider, which sends it back to ``back_to`` (OpenID Connect
        RP-Initiated Logout, the client id as hint: raypod keeps no ID token). Returns where to send the browser;
        None for a session of a pasted API token, or a provider that offers no logout."""
        if token_id is None or not self.records.minted(token_id):
            return None
        self.identities.revoke_token(token_id)
        try:
            end_session = self.keys.endpoint("end_session_endpoint")
        except errors.RaypodError:
            return None
        query = urlencode({"client_id": self.settings.client_id, "post_logout_redirect_uri": back_to})
        return f"{end_session}{'&' if '?' in end_session else '?'}{query}"

    # -- the CLI: device authorization flow, then refresh --------------------------------------------------------

    def begin_device_login(self) -> DeviceLogin:
        """Ask the provider for a device login; the CLI shows its user code and URL and polls ``poll_device``."""
        url = self.keys.endpoint("device_authorization_endpoint")
        try:
            response = self.http.post(url, data={"scope": self.settings.scopes}, auth=self._client_auth())
            found = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise errors.TransientError(f"the single sign-on provider did not answer ({type(exc).__name__})") from None
        if response.status_code != 200 or "device_code" not in found:
            raise errors.TransientError(f"the single sign-on provider refused a device login: {_oauth_error(found)}")
        return DeviceLogin(
            device_code=str(found["device_code"]),
            user_code=str(found["user_code"]),
            verification_uri=str(found["verification_uri"]),
            verification_uri_complete=found.get("verification_uri_complete"),
            expires_in=int(found.get("expires_in", 600)),
            interval=int(found.get("interval", 5)),
        )

    def poll_device(self, device_code: str) -> SignedIn | None:
        """None while the user has not finished at the provider; then they are signed in for ``token_ttl``.

        Raises:
            Unauthenticated (denied, expired), Forbidden, Conflict, TransientError."""
        try:
            tokens = self._token_request(grant_type=DEVICE_GRANT, device_code=device_code[:512])
        except _Pending:
            return None
        claims = verify_jwt(self.keys, self._id_token(tokens))
        return self.sign_in(claims, "sso-cli", self.settings.token_ttl, tokens.get("refresh_token"))

    def refresh(self, refresh_token: str) -> SignedIn:
        """A new raypod token from the provider's refresh token: the provider says who the user is and which groups
        they are in now, so one removed from a group, or from the provider, is refused here.

        Raises:
            Unauthenticated (the provider refused the refresh token), Forbidden (no longer in a mapped group)."""
        tokens = self._token_request(grant_type="refresh_token", refresh_token=refresh_token[:4096])
        claims = verify_jwt(self.keys, self._id_token(tokens))
        return self.sign_in(claims, "sso-cli", self.settings.token_ttl, tokens.get("refresh_token") or refresh_token)

    # -- the provider ending sessions --------------------------------------------------------------------------------

    def backchannel_logout(self, logout_token: str) -> int:
        """The provider says a session (``sid``) or a user (``sub``) logged out there: revoke every raypod token
        minted for it, which ends its console sessions at once. Returns how many tokens were revoked.

        Raises:
            Unauthenticated: not a logout token the provider signed for raypod."""
        claims = verify_jwt(self.keys, logout_token, logout=True)
        sid, subject = claims.get("sid"), claims.get("sub")
        found = self.records.token_ids(
            self.settings.issuer, subject=str(subject) if subject and not sid else None, sid=str(sid) if sid else None
        )
        for token_id in found:
            self.identities.revoke_token(token_id)
        return len(found)

    # -- one way in --------------------------------------------------------------------------------------------------

    def sign_in(self, claims: dict[str, Any], token_name: str, ttl: timedelta, refresh_token: str | None) -> SignedIn:
        """Map a verified ID token's identity and groups onto a raypod user (made on first login, its teams and
        admin flag set from the groups each time) and mint a token for it.

        Raises:
            Forbidden: in no group raypod maps (every token of its user is revoked: removal takes effect now).
            Conflict: the name belongs to a local user or another identity."""
        subject = str(claims["sub"])
        is_admin, roles = grants(self.settings, claims)
        bound = self.records.account_user(self.settings.issuer, subject)
        if not roles and not is_admin:
            # The provider decides who may use raypod: the user's own tokens and any an admin made for it go too.
            revoked = {t.id for t in self.identities.list_tokens(bound) if t.revoked_at is None} if bound else set()
            for token_id in revoked | set(self.records.token_ids(self.settings.issuer, subject=subject)):
                self.identities.revoke_token(token_id)
            raise errors.Forbidden(
                "you are in none of the groups raypod gives access to (RAYPOD_SSO_GROUPS); ask an admin"
            )
        user = bound or user_name(claims, self.settings.username_claim)
        managed = {g.team for gs in self.settings.groups.values() for g in gs if g.team is not None}
        self.records.sign_in(self.settings.issuer, subject, user, is_admin=is_admin, roles=roles, managed_teams=managed)
        self.identities.cache.clear()
        token = self.identities.create_token(user, token_name, ttl)
        sid = claims.get("sid")
        self.records.insert_token(token.id, self.settings.issuer, subject, str(sid) if sid else None)
        principal = replace(self.identities.principal(user), token_id=token.id, token_expires_at=token.expires_at)
        return SignedIn(principal=principal, token=token, refresh_token=refresh_token)

    # -- the provider's token endpoint ------------------------------------------------------------------------------

    def _oauth(self) -> OAuth2Client:
        return OAuth2Client(
            client_id=self.settings.client_id,
            client_secret=self.settings.client_secret,
            redirect_uri=self.redirect_url,
            code_challenge_method="S256",
            timeout=10.0,
        )

    def _client_auth(self) -> tuple[str, str]:
        return (self.settings.client_id, self.settings.client_secret)

    def _token_request(self, **params: str) -> dict[str, Any]:
        url = self.keys.endpoint("token_endpoint")
        with self._oauth() as client:
            try:
                found = client.fetch_token(url, **params)
            except OAuthError as exc:
                if exc.error in ("authorization_pending", "slow_down"):
                    raise _Pending from None
                raise errors.Unauthenticated(
                    f"the single sign-on provider refused: {exc.error}"
                    + (f" ({str(exc.description)[:200]})" if exc.description else "")
                ) from None
            except httpx.HTTPError as exc:
                raise errors.TransientError(
                    f"the single sign-on provider did not answer ({type(exc).__name__})"
                ) from None
        return dict(found)

    @staticmethod
    def _id_token(tokens: dict[str, Any]) -> str:
        found = tokens.get("id_token")
        if not isinstance(found, str):
            raise errors.Unauthenticated("the single sign-on provider sent no ID token (is 'openid' in the scopes?)")
        return found

    def close(self) -> None:
        self.http.close()


class _Pending(Exception):
    """The device login is not finished at the provider yet."""


def _oauth_error(found: object) -> str:
    if isinstance(found, dict):
        return f"{str(found.get('error', 'unknown'))[:60]} {str(found.get('error_description', ''))[:200]}".strip()
    return "no JSON answer"
