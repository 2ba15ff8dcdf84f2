"""GPU health against recorded NVML answers. These machines have no GPU (and no NVML), so the NVML module is a
stand-in that replays what nvidia-ml-py returns on a healthy 2-GPU host, then on one with faults."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from raypod.capabilities.resilience.gpu import GpuHealth
from raypod.capabilities.resilience.model import Level


class NVMLError(Exception):
    pass


@dataclass
class _Event:
    device: int
    eventData: int


@dataclass
class RecordedNvml:
    """The subset of pynvml GpuHealth calls, answering from recorded values."""

    count: int = 2
    ecc: dict[int, int] = field(default_factory=dict)
    events: list[_Event] = field(default_factory=list)
    broken: bool = False
    NVMLError: type[Exception] = NVMLError
    nvmlEventTypeXidCriticalError: int = 8
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED: int = 1
    NVML_VOLATILE_ECC: int = 0

    def nvmlInit(self) -> None:
        pass

    def nvmlEventSetCreate(self) -> str:
        return "set"

    def nvmlDeviceGetCount(self) -> int:
        if self.broken:
            raise NVMLError("GPU is lost")
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceRegisterEvents(self, handle: int, types: int, events: Any) -> None:
        pass

    def nvmlDeviceGetTotalEccErrors(self, handle: int, kind: int, counter: int) -> int:
        assert (kind, counter) == (1, 0), "uncorrected, volatile"
        return self.ecc.get(handle, 0)

    def nvmlEventSetWait(self, events: Any, timeout_ms: int) -> _Event:
        if not self.events:
            raise NVMLError("Timeout")
        return self.events.pop(0)

    def nvmlDeviceGetIndex(self, device: int) -> int:
        return device


def test_a_healthy_host_passes() -> None:
    assert GpuHealth(RecordedNvml()).check(2).level is Level.OK


def test_a_vanished_gpu_fails() -> None:
    result = GpuHealth(RecordedNvml(count=1)).check(2)
    assert result.level is Level.FAIL and "1 GPU(s) visible, 2 expected" in result.detail


def test_uncorrectable_ecc_and_critical_xids_fail_application_xids_do_not() -> None:
    nvml = RecordedNvml(ecc={1: 4}, events=[_Event(0, 79), _Event(0, 13)])
    result = GpuHealth(nvml).check(2)
    assert result.level is Level.FAIL
    assert "GPU 1: 4 uncorrectable ECC error(s)" in result.detail and "GPU 0: XID 79" in result.detail
    assert "13" not in result.detail, "XID 13 is an application error, not a broken GPU"
    only_app_error = GpuHealth(RecordedNvml(events=[_Event(1, 13)])).check(2)
    assert only_app_error.level is Level.OK


def test_nvml_errors_fail_the_signal() -> None:
    nvml = RecordedNvml()
    health = GpuHealth(nvml)
    nvml.broken = True
    result = health.check(1)
    assert result.level is Level.FAIL and "GPU is lost" in result.detail


def test_without_nvml_gpu_health_is_unavailable_not_failing() -> None:
    assert GpuHealth.from_host() is None  # no nvidia-ml-py, no driver on these machines
