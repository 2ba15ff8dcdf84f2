"""The monitoring agent of one node: ``python -m raypod.capabilities.hangwatch.agent DIR``.

It follows every Ray Train rank on its node through the files the ranks write (``ranks/``) and their logs, and
each poll: matches new log lines against the rules, asks the detector for a verdict per run, and on a detection
gathers diagnostics (py-spy stacks, last log lines), writes them to ``detections/``, writes a line into each
rank's log (Ray streams it to the job's log) and, with ``cancel``, kills the hung ranks so Ray Train's
``FailureConfig`` restarts the run from its last checkpoint. It never changes the cluster; the control plane
reads ``status.json`` and ``detections/`` and does the rest (events, metrics, webhook, failing a job).

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

log = logging.getLogger("raypod.hangwatch")

FORGET_DEAD_S = 600.0


class Agent:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.settings = spec_mod.HangwatchSpec()
        self._config_mtime = -1.0
        self._tails: dict[int, logs.LogTail] = {}
        self._cpu: dict[int, tuple[float, float]] = {}  # pid -> (cpu seconds, when)
        self._compiled: dict[str, Any] = {}
        saved = layout.read_json(root / "state.json") or {}
        self.rules: dict[str, dict[str, detector.RuleClock]] = {
            pid: {name: detector.RuleClock.from_json(c) for name, c in clocks.items()}
            for pid, clocks in (saved.get("rules") or {}).items()
        }
        self.offsets: dict[str, int] = {str(k): int(v) for k, v in (saved.get("offsets") or {}).items()}
        # run_id -> {"attempts": [attempts detected], "count": hangs with no progress in between, "at": time}
        self.runs: dict[str, dict[str, Any]] = saved.get("runs") or {}

    # -- one poll ------------------------------------------------------------------------------------------

    def poll(self, now: float) -> None:
        self._load_config()
        live, dead = self._ranks()
        for pid in dead:
            self._tails.pop(pid, None)
            self._cpu.pop(pid, None)
        by_run: dict[str, list[detector.RankState]] = {}
        for record in live:
            state = detector.RankState(record, self.rules.setdefault(str(record["pid"]), {}))
            by_run.setdefault(str(record.get("run_id")), []).append(state)
        statuses = []
        for run_id, ranks in by_run.items():
            settings = detector.settings_of(self.settings, ranks)
            for state in ranks:
                self._read_log(settings, state, now)
            statuses.append(self._watch(run_id, settings, ranks, now))
        layout.write_json(
            self.root / "status.json",
            {"agent_pid": os.getpid(), "time": now, "poll_s": self.settings.poll, "runs": statuses},
        )
        self._save()

    def _watch(
        self, run_id: str, settings: spec_mod.HangwatchSpec, ranks: list[detector.RankState], now: float
    ) -> dict[str, Any]:
        run = self.runs.setdefault(run_id, {"attempts": [], "count": 0, "at": None})
        attempt = str(ranks[0].record.get("attempt"))
        if run["at"] is not None and any((r.record.get("last_report") or 0) > run["at"] for r in ranks):
            # Progress since the last detection: the hang is over, and the count of hangs in a row starts again.
            run["count"], run["at"] = 0, None
            run["attempts"] = [a for a in run["attempts"] if a != attempt]
        verdict = detector.evaluate(settings, ranks, now)
        detection = None
        if verdict is not None and attempt not in run["attempts"]:
            run["attempts"] = [*run["attempts"][-20:], attempt]
            run["count"] += 1
            run["at"] = now
            detection = self._detect(run_id, attempt, settings, ranks, verdict, run["count"], now)
        first = min(ranks, key=lambda r: r.rank).record
        return {
            "run_id": run_id,
            "run": first.get("run"),
            "attempt": attempt,
            "job_id": first.get("job_id"),
            "raypod_job": first.get("raypod_job"),
            "hung": verdict is not None,
            "detection": detection,
            "action": settings.action.value,
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
            "slowest_step_s": record.get("slowest_step_s"),
            "paused": record.get("paused"),
            "cpu_pct": self._cpu_pct(int(record["pid"]), now),
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
    ) -> str:
        started = time.monotonic()
        pids = [int(r.record["pid"]) for r in ranks]
        stacks = diagnostics.dump_stacks(pids)
        diagnostics_s = time.monotonic() - started
        exhausted = settings.action is spec_mod.HangAction.CANCEL and count > settings.max_hang_restarts
        if exhausted:
            action = "fail-job"
        elif settings.action is spec_mod.HangAction.CANCEL:
            action = "cancel"
        else:
            action = "notify"
        order = sorted(ranks, key=lambda r: float(r.record.get("clock") or now))
        first = order[0].record
        detection_id = f"{run_id[:12]}-{attempt[:12]}-{first.get('node') or 'node'}-{verdict.kind}"
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
        tail = self._tails.get(int(state.record["pid"]))
        return list(tail.last_lines) if tail is not None else []

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
        """CPU use since the previous poll (100 = one core), from /proc: an idle rank in a hang reads ~0."""
        try:
            with open(f"/proc/{pid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            seconds = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return None
        before = self._cpu.get(pid)
        if before is None or now - before[1] < 0.5:
            if before is None:
                self._cpu[pid] = (seconds, now)
            return None
        self._cpu[pid] = (seconds, now)
        return round(100.0 * (seconds - before[0]) / (now - before[1]), 1)

    def _save(self) -> None:
        layout.write_json(
            self.root / "state.json",
            {
                "rules": {pid: {n: c.to_json() for n, c in clocks.items()} for pid, clocks in self.rules.items()},
                "offsets": self.offsets,
                "runs": self.runs,
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
    agent = Agent(root)
    stop = False

    def _stop(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    log.info("hangwatch agent %d follows %s", os.getpid(), root)
    while not stop:
        started = time.monotonic()
        try:
            agent.poll(time.time())
        except Exception:
            log.exception("hangwatch poll failed")
        time.sleep(max(0.05, agent.settings.poll - (time.monotonic() - started)))


if __name__ == "__main__":
    main(sys.argv)
