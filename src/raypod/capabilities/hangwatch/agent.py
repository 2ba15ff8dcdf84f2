"""The monitoring agent of one node: ``python -m raypod.capabilities.hangwatch.agent DIR``.

It follows every Ray Train rank on its node through the files the ranks write (``ranks/``) and their logs. Each
poll it matches new log lines against the rules and writes what it sees to ``status.json``. A rule's verdict
(a fault line, a rule's timeout) is its own to make; the no-progress verdict spans the run's nodes, so the
control plane makes it from every node's status and hands it over in ``requests/``. On a detection the agent
gathers diagnostics (py-spy stacks, last log lines) into ``detections/``, writes a line into each rank's log
(Ray streams it to the job's log) and, with ``cancel``, kills its hung ranks so Ray Train's ``FailureConfig``
restarts the run from its last checkpoint. It never changes the cluster.

Its timers live in the ranks' files and ``state.json``: an agent killed and restarted goes on where it was.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from raypod import spec as spec_mod
from raypod.capabilities.hangwatch import detector, diagnostics, layout, logs
from raypod.capabilities.hangwatch.gpu import GpuUse, visible_devices
from raypod.capabilities.hangwatch.report import Reporter

log = logging.getLogger("raypod.hangwatch")

FORGET_DEAD_S = 600.0
REQUEST_CHECK_S = 0.2


class Agent:
    def __init__(self, root: Path, gpus: GpuUse | None = None) -> None:
        self.root = root
        self.gpus = gpus
        self.settings = spec_mod.HangwatchSpec()
        self._config_mtime = -1.0
        self._tails: dict[int, logs.LogTail] = {}
        self._cpu: dict[int, tuple[float, float, float | None]] = {}  # pid -> (cpu seconds, when, its last %)
        self._compiled: dict[str, Any] = {}
        saved = layout.read_json(root / "state.json") or {}
        self.rules: dict[str, dict[str, detector.RuleClock]] = {
            pid: {name: detector.RuleClock.from_json(c) for name, c in clocks.items()}
            for pid, clocks in (saved.get("rules") or {}).items()
        }
        self.offsets: dict[str, int] = {str(k): int(v) for k, v in (saved.get("offsets") or {}).items()}
        # run_id -> {"attempts": [attempts detected], "count": faults with no progress in between, "at": time}
        self.runs: dict[str, dict[str, Any]] = saved.get("runs") or {}
        self.handled: list[str] = list(saved.get("handled") or [])
        self._by_run: dict[tuple[str, str], list[detector.RankState]] = {}

    # -- one poll ------------------------------------------------------------------------------------------

    def poll(self, now: float) -> None:
        self._load_config()
        live, dead = self._ranks()
        for pid in dead:
            self._tails.pop(pid, None)
            self._cpu.pop(pid, None)
        by_run: dict[tuple[str, str], list[detector.RankState]] = {}
        for record in live:
            state = detector.RankState(record, self.rules.setdefault(str(record["pid"]), {}))
            by_run.setdefault((str(record.get("run_id")), str(record.get("attempt"))), []).append(state)
        self._by_run = by_run
        statuses = []
        for (run_id, attempt), ranks in by_run.items():
            settings = detector.settings_of(self.settings, ranks)
            for state in ranks:
                self._read_log(settings, state, now)
            statuses.append(self._watch(run_id, attempt, settings, ranks, now))
        layout.write_json(
            self.root / "status.json",
            {"agent_pid": os.getpid(), "time": now, "poll_s": self.settings.poll, "runs": statuses},
        )
        self.handle_requests(now)
        self._save()

    def handle_requests(self, now: float) -> None:
        """Act on the control plane's verdicts for runs with ranks here; each request once (a restart too)."""
        directory = self.root / "requests"
        for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
            request = layout.read_json(path)
            layout.with_suppressed_unlink(path)  # read once: a request left behind would only be skipped
            if request is None or path.stem in self.handled:
                continue
            self.handled = [*self.handled[-200:], path.stem]
            ranks = self._by_run.get((str(request.get("run_id")), str(request.get("attempt"))), [])
            if ranks:
                verdict = detector.Verdict(
                    str(request.get("kind", "hang")),
                    str(request.get("reason", "")),
                    list(request.get("ranks") or []),
                    float(request.get("last_progress") or now),
                    request.get("timeout_s"),
                )
                settings = detector.settings_of(self.settings, ranks)
                count = int(request.get("hangs_without_progress") or 1)
                self._detect(
                    str(request["run_id"]),
                    str(request["attempt"]),
                    settings,
                    ranks,
                    verdict,
                    count,
                    now,
                    action=str(request.get("action", "notify")),
                    detection_id=path.stem,
                )
            self._save()

    def _watch(
        self, run_id: str, attempt: str, settings: spec_mod.HangwatchSpec, ranks: list[detector.RankState], now: float
    ) -> dict[str, Any]:
        run = self.runs.setdefault(run_id, {"attempts": [], "count": 0, "at": None})
        if run["at"] is not None and any((r.record.get("last_report") or 0) > run["at"] for r in ranks):
            # Progress since the last detection: the fault is over, and the count in a row starts again.
            run["count"], run["at"] = 0, None
            run["attempts"] = [a for a in run["attempts"] if a != attempt]
        verdict = detector.evaluate(settings, ranks, now)
        if verdict is not None and attempt not in run["attempts"]:
            run["attempts"] = [*run["attempts"][-20:], attempt]
            run["count"] += 1
            run["at"] = now
            self._detect(run_id, attempt, settings, ranks, verdict, run["count"], now)
        first = min(ranks, key=lambda r: r.rank).record
        return {
            "run_id": run_id,
            "run": first.get("run"),
            "attempt": attempt,
            "job_id": first.get("job_id"),
            "raypod_job": first.get("raypod_job"),
            "world_size": first.get("world_size"),
            "enabled": settings.enabled,
            "action": settings.action.value,
            "max_hang_restarts": settings.max_hang_restarts,
            "ranks": [self._rank_status(settings, r, now) for r in sorted(ranks, key=lambda r: r.rank)],
        }

    def _rank_status(self, settings: spec_mod.HangwatchSpec, state: detector.RankState, now: float) -> dict[str, Any]:
        record = state.record
        return {
            "rank": state.rank,
            "pid": record.get("pid"),
            "node": record.get("node"),
            "reports": record.get("reports", 0),
            "last_report": record.get("last_report"),
            "stalled_s": detector.stalled_for(record, now),
            "timeout_s": detector.timeout_of(settings, record),
            "last_progress": record.get("clock"),
            "slowest_step_s": record.get("slowest_step_s"),
            "paused": record.get("paused"),
            "cpu_pct": self._cpu_pct(int(record["pid"]), now),
            "gpu_pct": self._gpu_pct(int(record["pid"])),
        }

    # -- a detection ---------------------------------------------------------------------------------------

    def _detect(
        self,
        run_id: str,
        attempt: str,
        settings: spec_mod.HangwatchSpec,
        ranks: list[detector.RankState],
        verdict: detector.Verdict,
        count: int,
        now: float,
        *,
        action: str | None = None,
        detection_id: str | None = None,
    ) -> str:
        started = time.monotonic()
        pids = [int(r.record["pid"]) for r in ranks]
        stacks = diagnostics.dump_stacks(pids)
        diagnostics_s = time.monotonic() - started
        action = action or detector.action_for(settings, count)
        order = sorted(ranks, key=lambda r: float(r.record.get("clock") or now))
        first = order[0].record
        detection_id = detection_id or f"{run_id[:12]}-{attempt[:12]}-{verdict.kind}"
        detection_id = f"{detection_id}-{first.get('node') or 'node'}"
        waits = [stacks[int(r.record["pid"])].waiting_in for r in ranks]
        detection = {
            "id": detection_id,
            "run_id": run_id,
            "run": first.get("run"),
            "attempt": attempt,
            "job_id": first.get("job_id"),
            "raypod_job": first.get("raypod_job"),
            "kind": verdict.kind,
            "rule": verdict.rule,
            "reason": verdict.reason,
            "timeout_s": verdict.timeout_s,
            "last_progress": verdict.last_progress,
            "detected_at": now,
            "action": action,
            "hangs_without_progress": count,
            "max_hang_restarts": settings.max_hang_restarts,
            "diagnostics_s": round(diagnostics_s, 3),
            "common_wait": diagnostics.common_wait(waits),
            "stalled_first": [r.rank for r in order],
            "ranks": [
                {
                    "rank": r.rank,
                    "pid": r.record.get("pid"),
                    "node": r.record.get("node"),
                    "reports": r.record.get("reports", 0),
                    "last_report": r.record.get("last_report"),
                    "stalled_s": detector.stalled_for(r.record, now),
                    "cpu_pct": self._cpu_pct(int(r.record["pid"]), now),
                    "gpu_pct": self._gpu_pct(int(r.record["pid"])),
                    "stack": stacks[int(r.record["pid"])].text,
                    "stack_error": stacks[int(r.record["pid"])].error,
                    "waiting_in": stacks[int(r.record["pid"])].waiting_in,
                    "log_tail": self._last_lines(r),
                }
                for r in sorted(ranks, key=lambda r: r.rank)
            ],
        }
        layout.write_json(layout.detections_dir(self.root) / f"{detection_id}.json", detection)
        line = f"[raypod hangwatch] {verdict.kind} detected: {verdict.reason}; action: {action}"
        for state in ranks:
            _append_line(state.record.get("log"), line)
        log.warning("%s (run %s)", line, first.get("run"))
        if action == "cancel":
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for state in ranks:
            for clock in state.rules.values():
                clock.fault_line = None
        return detection_id

    # -- inputs --------------------------------------------------------------------------------------------

    def _load_config(self) -> None:
        path = self.root / "config.json"
        try:
            mtime = path.stat().st_mtime
        except OSError:
            return
        if mtime == self._config_mtime:
            return
        data = layout.read_json(path)
        try:
            self.settings = spec_mod.HangwatchSpec.model_validate(data or {})
        except ValueError:
            log.warning("ignoring an invalid %s", path)
        self._config_mtime = mtime

    def _ranks(self) -> tuple[list[dict[str, Any]], list[int]]:
        live, dead = [], []
        for path in layout.ranks_dir(self.root).glob("*.json"):
            record = layout.read_json(path)
            if record is None or not isinstance(record.get("pid"), int):
                continue
            pid = record["pid"]
            if not record.get("finished") and _alive(pid):
                live.append(record)
                continue
            dead.append(pid)
            try:
                if time.time() - path.stat().st_mtime > FORGET_DEAD_S:
                    path.unlink()
                    self.rules.pop(str(pid), None)
                    self.offsets.pop(str(pid), None)
            except OSError:
                pass
        return live, dead

    def _last_lines(self, state: detector.RankState) -> list[str]:
        return logs.last_lines(state.record.get("log"))

    def _read_log(self, settings: spec_mod.HangwatchSpec, state: detector.RankState, now: float) -> None:
        pid, path = int(state.record["pid"]), state.record.get("log")
        if not path:
            return
        tail = self._tails.get(pid)
        if tail is None:
            tail = self._tails[pid] = logs.LogTail(path, self.offsets.get(str(pid), 0))
        for line in tail.read():
            if settings.rules:
                detector.match_line(settings, state, line, now, self._compiled)
        self.offsets[str(pid)] = tail.offset

    def _cpu_pct(self, pid: int, now: float) -> float | None:
        """CPU use since the previous poll (100 = one core), from /proc: an idle rank in a hang reads ~0. Asked
        again within the same poll (a detection's diagnostics), it answers what the poll measured."""
        before = self._cpu.get(pid)
        if before is not None and now - before[1] < 0.5:
            return before[2]
        try:
            with open(f"/proc/{pid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            seconds = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return None
        pct = None if before is None else round(100.0 * (seconds - before[0]) / (now - before[1]), 1)
        self._cpu[pid] = (seconds, now, pct)
        return pct

    def _gpu_pct(self, pid: int) -> float | None:
        """Utilisation of the rank's GPUs (the busiest), where the node has GPUs and NVML."""
        if self.gpus is None:
            return None
        devices = visible_devices(pid)
        return None if devices is None else self.gpus.utilisation(devices)

    def _save(self) -> None:
        layout.write_json(
            self.root / "state.json",
            {
                "rules": {pid: {n: c.to_json() for n, c in clocks.items()} for pid, clocks in self.rules.items()},
                "offsets": self.offsets,
                "runs": self.runs,
                "handled": self.handled,
            },
        )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _append_line(path: str | None, line: str) -> None:
    if not path:
        return
    try:
        with open(path, "a") as handle:
            handle.write(line + "\n")
    except OSError:
        pass


def main(argv: list[str]) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    root = Path(argv[1])
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    agent = Agent(root, GpuUse.from_host())
    stop = False

    def _stop(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    log.info("hangwatch agent %d follows %s", os.getpid(), root)
    requests = root / "requests"
    reporter = Reporter.from_environment(root)
    while not stop:
        started = time.monotonic()
        try:
            agent.poll(time.time())
            if reporter is not None and reporter.report():
                agent.handle_requests(time.time())
        except Exception:
            log.exception("hangwatch poll failed")
        # Between polls, look for the control plane's requests often: a stat of one directory.
        seen = _mtime(requests)
        while not stop and time.monotonic() - started < agent.settings.poll:
            time.sleep(REQUEST_CHECK_S)
            if _mtime(requests) != seen:
                seen = _mtime(requests)
                try:
                    agent.handle_requests(time.time())
                except Exception:
                    log.exception("hangwatch request failed")


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


if __name__ == "__main__":
    main(sys.argv)
