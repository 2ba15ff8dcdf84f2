"""GPU utilisation of a rank's GPUs through NVML (``nvidia-ml-py``), where GPUs exist: a hung rank's GPUs sit
idle while allocated.

A rank's GPUs are the ones Ray gave it (``CUDA_VISIBLE_DEVICES`` in its environment), not the ones NVML lists
its pid on: NVML reports host pids, and a sandboxed node's agent sees its own namespace's. The NVML module is
passed in (``pynvml`` in production); tests replay recorded answers, since these machines have no GPU.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


class GpuUse:
    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        nvml.nvmlInit()

    @classmethod
    def from_host(cls) -> GpuUse | None:
        """NVML of this node, or None where there is no driver, no GPU or no ``nvidia-ml-py``."""
        try:
            import pynvml  # type: ignore[import-not-found]

            use = cls(pynvml)
            return use if pynvml.nvmlDeviceGetCount() else None
        except Exception as exc:  # no library or no driver: there is no GPU signal, and nothing is wrong
            log.debug("no GPU utilisation: %s", exc)
            return None

    def utilisation(self, devices: list[str]) -> float | None:
        """The busiest of ``devices`` (indices or UUIDs, as in CUDA_VISIBLE_DEVICES), percent; None: unknown."""
        nvml = self.nvml
        found = []
        for device in devices:
            try:
                handle = (
                    nvml.nvmlDeviceGetHandleByIndex(int(device))
                    if device.isdigit()
                    else nvml.nvmlDeviceGetHandleByUUID(device)
                )
                found.append(float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu))
            except (nvml.NVMLError, ValueError):
                continue
        return max(found) if found else None


def visible_devices(pid: int) -> list[str] | None:
    """The GPUs Ray gave process ``pid`` (its CUDA_VISIBLE_DEVICES); None: none, or it cannot be read."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            variables = handle.read().split(b"\0")
    except OSError:
        return None
    for variable in variables:
        if variable.startswith(b"CUDA_VISIBLE_DEVICES="):
            value = variable.split(b"=", 1)[1].decode(errors="replace").strip()
            devices = [d.strip() for d in value.split(",") if d.strip() and d.strip() != "-1"]
            return devices or None
    return None
