"""How a cluster grows and shrinks from Ray's own demand: the settings its autoscaler runs with. A group scales
within ``[min_replicas, max_replicas]``; these say how fast and when an idle node goes."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from raypod.spec.values import Strict


class Upscaling(StrEnum):
    """As Ray's autoscaler's ``upscaling_speed`` (KubeRay's ``upscalingMode``)."""

    DEFAULT = "Default"  # grows by up to the current size per round
    AGGRESSIVE = "Aggressive"  # starts every node the demand needs at once
    CONSERVATIVE = "Conservative"  # one node at a time


class AutoscalingSpec(Strict):
    idle_timeout_s: int = Field(60, ge=0, le=7 * 24 * 3600, description="An idle worker is removed after this long.")
    upscaling: Upscaling = Upscaling.DEFAULT
