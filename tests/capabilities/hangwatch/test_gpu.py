"""A rank's GPU utilisation against recorded NVML answers (no GPU or NVML on these machines), and the GPUs a
real process was given, read from its environment as the agent reads a Ray worker's."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raypod.capabilities.hangwatch import agent as agent_mod
from raypod.capabilities.hangwatch import layout
from raypod.capabilities.hangwatch.gpu import GpuUse, visible_devices


class NVMLError(Exception):
    pass


@dataclass
class _Rates:
    gpu: int


@dataclass
class RecordedNvml:
    """What nvidia-ml-py answers on a 4-GPU host where GPU 1 is busy and GPU 2 idle (a hung rank's)."""

    utilisation: dict[int, int] = field(default_factory=lambda: {0: 35, 1: 97, 2: 0, 3: 12})
    uuids: dict[str, int] = field(default_factory=lambda: {"GPU-8c1f": 2})
    NVMLError: type[Exception] = NVMLError

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index not in self.utilisation:
            raise NVMLError("Invalid Argument")
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        if uuid not in self.uuids:
            raise NVMLError("Not Found")
        return self.uuids[uuid]

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> _Rates:
        return _Rates(self.utilisation[handle])


def test_the_busiest_of_a_ranks_gpus_is_its_utilisation_and_unknown_gpus_are_skipped() -> None:
    use = GpuUse(RecordedNvml())
    assert use.utilisation(["0", "1"]) == 97
    assert use.utilisation(["GPU-8c1f"]) == 0
    assert use.utilisation(["7", "GPU-none"]) is None
    assert use.utilisation(["3", "7"]) == 12


def test_a_processs_gpus_come_from_its_environment(tmp_path: Path) -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "2,GPU-8c1f"}
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    plain = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env={k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"},
    )
    try:
        time.sleep(0.2)
        assert visible_devices(child.pid) == ["2", "GPU-8c1f"]
        assert visible_devices(plain.pid) is None
        root = tmp_path / "hw"
        now = time.time()
        layout.write_json(
            layout.ranks_dir(root) / f"{child.pid}.json",
            {
                "pid": child.pid,
                "run_id": "r" * 32,
                "attempt": "a" * 16,
                "rank": 0,
                "world_size": 1,
                "started": now,
                "clock": now,
                "reports": 1,
            },
        )
        recorded: Any = RecordedNvml()
        agent_mod.Agent(root, GpuUse(recorded)).poll(now)
        status = layout.read_json(root / "status.json")
        assert status is not None and status["runs"][0]["ranks"][0]["gpu_pct"] == 0
    finally:
        for process in (child, plain):
            process.kill()
            process.wait()
