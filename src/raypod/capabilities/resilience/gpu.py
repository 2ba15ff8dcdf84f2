"""GPU health through NVML (``nvidia-ml-py``): a GPU that vanished, XID errors, uncorrectable ECC errors.

Only used where GPUs exist; tests drive it with recorded NVML answers, since these machines have none. The NVML
module is passed in (``pynvml`` in production), so nothing here imports it at module load.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from raypod.capabilities.resilience.model import Level, SignalResult

log = logging.getLogger(__name__)

# XIDs that mean the GPU needs a reset or replacement (NVIDIA's XID catalogue): not application errors.
CRITICAL_XIDS = frozenset({48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140})


class GpuHealth:
    """Reads the host's GPUs once per call; XID events are collected between calls."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        nvml.nvmlInit()
        self._events = nvml.nvmlEventSetCreate()
        self._xids: dict[int, list[int]] = {}
        for index in range(nvml.nvmlDeviceGetCount()):
            with contextlib.suppress(nvml.NVMLError):  # not every GPU supports events
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, self._events)

    @classmethod
    def from_host(cls) -> GpuHealth | None:
        """NVML of this host, or None where there is no driver or no ``nvidia-ml-py``."""
        try:
            import pynvml  # type: ignore[import-not-found]

            return cls(pynvml)
        except Exception as exc:  # no library, no driver: GPU health is unknown, not failing
            log.info("GPU health unavailable: %s", exc)
            return None

    def check(self, expected: int, *, threshold: int = 1) -> SignalResult:
        """``expected``: the GPUs the node's spec asks for."""
        nvml = self.nvml
        try:
            count = nvml.nvmlDeviceGetCount()
            self._drain_events()
            problems: list[str] = []
            if count < expected:
                problems.append(f"{count} GPU(s) visible, {expected} expected")
            for index in range(count):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                ecc = nvml.nvmlDeviceGetTotalEccErrors(
                    handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
                )
                if ecc:
                    problems.append(f"GPU {index}: {ecc} uncorrectable ECC error(s)")
                critical = [xid for xid in self._xids.get(index, []) if xid in CRITICAL_XIDS]
                if critical:
                    problems.append(f"GPU {index}: XID {', '.join(map(str, sorted(set(critical))))}")
        except nvml.NVMLError as exc:
            return SignalResult("gpu", Level.FAIL, f"NVML: {exc}", threshold)
        if problems:
            return SignalResult("gpu", Level.FAIL, "; ".join(problems), threshold)
        return SignalResult("gpu", Level.OK)

    def _drain_events(self) -> None:
        nvml = self.nvml
        while True:
            try:
                event = nvml.nvmlEventSetWait(self._events, 0)
            except nvml.NVMLError:  # NVML_ERROR_TIMEOUT: no more events
                return
            index = nvml.nvmlDeviceGetIndex(event.device)
            self._xids.setdefault(index, []).append(int(event.eventData))
