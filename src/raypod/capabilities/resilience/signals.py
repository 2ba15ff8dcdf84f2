"""The probes behind each signal. Every one is bounded in time and in what it reads, and turns its answer into a
``SignalResult``; an answer it cannot get is ``None`` (unknown), never a failure it did not see."""

from __future__ import annotations

import shutil

import httpx

from raypod.backends.commands import CommandResult
from raypod.capabilities.resilience.model import Level, SignalResult

AGENT_HEALTH_PATH = "/api/local_raylet_healthz"  # public on Ray's dashboard agent, answers from the raylet's view
HOST_MEMORY_WARN_FRACTION = 0.05


def probe_agent(http: httpx.Client, endpoint: str, *, timeout_s: float, threshold: int) -> SignalResult:
    """Liveness of the node's dashboard agent: a frozen node (its processes stopped) does not answer at all."""
    try:
        response = http.get(f"http://{endpoint}{AGENT_HEALTH_PATH}", timeout=timeout_s)
    except httpx.TimeoutException:
        return SignalResult("agent", Level.FAIL, f"agent at {endpoint} did not answer in {timeout_s:g} s", threshold)
    except httpx.HTTPError as exc:
        return SignalResult("agent", Level.FAIL, f"agent at {endpoint} unreachable ({type(exc).__name__})", threshold)
    if response.status_code != 200:
        text = response.text[:200].strip()
        return SignalResult("agent", Level.FAIL, f"agent answered {response.status_code}: {text}", threshold)
    return SignalResult("agent", Level.OK)


def check_disk(path: str, *, min_free: int, threshold: int) -> SignalResult:
    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return SignalResult("disk", None)
    if usage.free < min_free:
        detail = f"{_mib(usage.free)} free under {path}, below {_mib(min_free)}"
        return SignalResult("disk", Level.FAIL, detail, threshold)
    return SignalResult("disk", Level.OK)


def check_memory(used: int | None, budget: int) -> SignalResult:
    """The node's processes together (proportional set size) against its budget (Ray memory, object store,
    overhead). Advisory: Ray's own memory monitor kills the worker that uses the most when the host runs short,
    and replacing a node for what its workload uses would destroy that work and fix nothing."""
    if used is None:
        return SignalResult("memory", None)
    if used > budget:
        return SignalResult("memory", Level.WARN, f"node uses {_mib(used)}, over its budget of {_mib(budget)}")
    return SignalResult("memory", Level.OK)


def check_host_memory(available: int, total: int) -> SignalResult:
    """Host-wide pressure is advisory: replacing a node on the same host would not relieve it."""
    if total and available < total * HOST_MEMORY_WARN_FRACTION:
        return SignalResult("host-memory", Level.WARN, f"host has {_mib(available)} of {_mib(total)} available")
    return SignalResult("host-memory", Level.OK)


def command_signal(result: CommandResult, name: str, *, timeout_s: float, threshold: int) -> SignalResult:
    """A user health check's run: exit 0 is fine; a non-zero exit or a timeout is a failure."""
    if result.exit_code == 0:
        return SignalResult(f"check:{name}", Level.OK)
    if result.exit_code is None:
        detail = f"timed out after {timeout_s:g} s"
    else:
        tail = result.output.strip().splitlines()[-1:] if result.output.strip() else []
        detail = f"exit {result.exit_code}" + (f": {tail[0][:200]}" if tail else "")
    return SignalResult(f"check:{name}", Level.FAIL, detail, threshold)


def _mib(number: int) -> str:
    return f"{number / 2**20:.0f} MiB"
