"""Kubernetes API failures in words an operator can act on: what is missing, which verb was refused, which server
could not be reached. Never a traceback."""

from __future__ import annotations

import json

import urllib3.exceptions
from kubernetes.client.exceptions import ApiException

from raypod import errors

CRD_HINT = "install the KubeRay operator and its CRDs (helm install kuberay-operator kuberay/kuberay-operator)"


def explain(exc: Exception, doing: str) -> str:
    """One line: what raypod was doing and why the API server said no (or did not answer)."""
    if isinstance(exc, ApiException):
        detail = _message(exc)
        if exc.status == 401:
            return f"{doing}: the API server refused raypod's credentials (an expired token?): {detail}"
        if exc.status == 403:
            return f"{doing}: forbidden by RBAC: raypod's service account lacks this verb ({detail})"
        if exc.status == 404 and any(kind in doing.lower() for kind in ("raycluster", "rayjob", "rayservice")):
            return f"{doing}: the resource is not served: {CRD_HINT} ({detail})"
        return f"{doing}: the API server answered {exc.status} {exc.reason}: {detail}"
    if isinstance(exc, urllib3.exceptions.HTTPError | OSError):
        return f"{doing}: cannot reach the Kubernetes API server: {type(exc).__name__}: {exc}"
    return f"{doing}: {type(exc).__name__}: {exc}"


def to_raypod(exc: Exception, doing: str) -> errors.RaypodError:
    """The raypod error for a failed call: permanent where retrying cannot help (RBAC, a missing CRD, a refused
    object), transient otherwise (an outage, a conflict)."""
    message = explain(exc, doing)
    if isinstance(exc, ApiException) and exc.status in (403, 404, 422):
        return errors.PermanentError(message)
    return errors.TransientError(message)


def _message(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or "")
    except (TypeError, ValueError):
        return str(exc.reason or "")[:300]
    return str(body.get("message") or exc.reason or "")[:300] if isinstance(body, dict) else str(exc.reason)
