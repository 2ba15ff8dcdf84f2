"""What a deployment's replicas are built from: the control plane writes it, the deploy job hands it to Serve as
the deployment's argument, each replica reads it. Pydantic only, so the control plane imports it without Ray."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from raypod.serving.catalog import ModelEntry


class ServeSettings(BaseModel):
    entry: ModelEntry
    kv_cache: bool = True
    l1_bytes: int = 2**30
    l2_url: str | None = None
    l2_url_file: str | None = Field(None, description="A file on the nodes holding the L2 URL (it has a password).")
    chunk_tokens: int = 256
    threads: int = 0
    reserve_tokens: int = 0


class DeployRequest(BaseModel):
    """The deploy job's argument."""

    action: str = Field(pattern="^(deploy|delete)$")
    name: str
    http_port: int = 0
    engine: str = "cpu"
    settings: ServeSettings | None = None
    options: dict[str, Any] = Field(default_factory=dict, description="Serve deployment options.")
