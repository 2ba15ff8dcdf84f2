"""raypod: Ray clusters without YAML.

This module stays light on purpose: Ray imports it to resolve ``raypod://`` job-submission addresses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from raypod.client import Client


def __getattr__(name: str) -> Any:
    if name == "Client":
        from raypod.client import Client

        return Client
    raise AttributeError(f"module 'raypod' has no attribute {name!r}")


__all__ = ["Client", "__version__"]
