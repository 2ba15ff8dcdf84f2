"""How a cluster grows and shrinks from Ray's own demand: the settings its autoscaler runs with. A group scales
within ``[min_replicas, max_replicas]``; these say how fast and when an idle node goes."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from raypod.spec.values import Strict


class Upscaling(StrEnum):
    """KubeRay's ``upscalingMode``, mapped as KubeRay maps it onto Ray's ``upscaling_speed``."""

    DEFAULT = "Default"  # every node the demand needs at once (speed 1000)
    AGGRESSIVE = "Aggressive"  # the same as Default, as in KubeRay
    CONSERVATIVE = "Conservative"  # no more nodes starting at once than the group runs (at least one; speed 1)


class AutoscalingSpec(Strict):
    idle_timeout_s: int = Field(60, ge=0, le=7 * 24 * 3600, description="An idle worker is removed after this long.")
    upscaling: Upscaling = Upscaling.DEFAULT
