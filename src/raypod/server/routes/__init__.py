"""The REST API, one router per noun; each route is a call of its noun's service."""

from __future__ import annotations

from typing import Any

from fastapi import Depends, Request


def part(name: str) -> Any:
    """A dependency on one of the control plane's parts (``clusters``, ``jobs``, ...), which the app keeps in its
    state: ``Service = Annotated[JobService, part("jobs")]``."""

    def dependency(request: Request) -> Any:
        return getattr(request.app.state, name)

    dependency.__name__ = f"{name}_part"
    return Depends(dependency)
