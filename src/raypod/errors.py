"""The one exception hierarchy of raypod, shared by server, client and CLI.

Each class carries a stable ``code`` and the HTTP status the server answers with, so the client can rebuild
the same class from a response and SDK users catch ``raypod.errors.NotFound`` wherever the server runs::

    RaypodError                      500 internal
    ├── InvalidSpec                  422 invalid_spec
    ├── Unauthenticated              401 unauthenticated
    ├── Forbidden                    403 forbidden
    ├── NotFound                     404 not_found
    ├── AlreadyExists                409 already_exists
    ├── Conflict                     409 conflict
    ├── InsufficientCapacity         422 insufficient_capacity
    ├── ServerUnreachable            503 server_unreachable   (raised by the client only)
    └── BackendError                 502 backend_error
        ├── TransientError           503 transient            (retried with backoff)
        └── PermanentError           502 permanent            (waits for the spec to change)
"""

from __future__ import annotations

from typing import Any, ClassVar


class RaypodError(Exception):
    """Base of every error raypod raises on purpose."""

    code: ClassVar[str] = "internal"
    http_status: ClassVar[int] = 500

    def __init__(self, message: str, detail: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "detail": self.detail}


class InvalidSpec(RaypodError):
    code = "invalid_spec"
    http_status = 422


class BadRequest(RaypodError):
    """A request raypod will not read as sent (ambiguous framing, a body where none belongs)."""

    code = "bad_request"
    http_status = 400


class PayloadTooLarge(RaypodError):
    code = "payload_too_large"
    http_status = 413


class TooManyRequests(RaypodError):
    code = "too_many_requests"
    http_status = 429


class Unauthenticated(RaypodError):
    code = "unauthenticated"
    http_status = 401


class Forbidden(RaypodError):
    code = "forbidden"
    http_status = 403


class NotFound(RaypodError):
    code = "not_found"
    http_status = 404


class AlreadyExists(RaypodError):
    code = "already_exists"
    http_status = 409


class Conflict(RaypodError):
    code = "conflict"
    http_status = 409


class QuotaExceeded(RaypodError):
    """Work beyond a team's quota, where the team's policy rejects rather than queues it."""

    code = "quota_exceeded"
    http_status = 409


class InsufficientCapacity(RaypodError):
    code = "insufficient_capacity"
    http_status = 422


class ServerUnreachable(RaypodError):
    code = "server_unreachable"
    http_status = 503


class BackendError(RaypodError):
    code = "backend_error"
    http_status = 502


class TransientError(BackendError):
    code = "transient"
    http_status = 503


class NotYet(TransientError):
    """The action cannot run yet (a sidecar of a node whose processes are still starting): the loop asks again next
    pass, without an event, a failure or a backoff."""

    code = "not_yet"


class PermanentError(BackendError):
    code = "permanent"
    http_status = 502


def _all_subclasses(cls: type[RaypodError]) -> list[type[RaypodError]]:
    found: list[type[RaypodError]] = [cls]
    for sub in cls.__subclasses__():
        found.extend(_all_subclasses(sub))
    return found


ERRORS_BY_CODE: dict[str, type[RaypodError]] = {cls.code: cls for cls in _all_subclasses(RaypodError)}


def from_payload(payload: dict[str, Any], fallback_status: int) -> RaypodError:
    """Rebuild the error a server answered with; unknown codes become a plain RaypodError."""
    cls = ERRORS_BY_CODE.get(str(payload.get("code")), RaypodError)
    message = str(payload.get("message") or f"server answered HTTP {fallback_status}")
    return cls(message, payload.get("detail"))
