"""Pure: a run's ranks on one node, its settings and its rules' clocks -> is it hung, and why. No I/O, no clock.

A rank makes progress when a ``ray.train.report`` returns. A run is hung when every one of its live ranks on
the node has gone without progress for the run's timeout (before the first report: the start timeout), none of
them paused (a checkpoint being saved, ``raypod.hangwatch.paused()``). In data-parallel training ranks move in
step: one stuck rank stops the others at their next collective, so each node's agent sees the hang.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from raypod import spec as spec_mod

ADAPTIVE_FACTOR = 5.0


@dataclass
class RuleClock:
    """One rule's state on one rank; the agent saves it, so a restarted agent keeps its timers."""

    last_match: float | None = None
    stopped: bool = False
    breaches: int = 0
    fault_line: str | None = None  # a fault_on_match line seen and not yet acted on

    def to_json(self) -> dict[str, Any]:
        return {"last_match": self.last_match, "stopped": self.stopped, "breaches": self.breaches}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RuleClock:
        return cls(data.get("last_match"), bool(data.get("stopped")), int(data.get("breaches") or 0))


@dataclass(frozen=True)
class Verdict:
    kind: str  # "hang" (no progress), "rule" (a rule's timeout) or "fault" (a fault_on_match line)
    reason: str
    ranks: list[int]
    last_progress: float
    timeout_s: float | None
    rule: str | None = None


@dataclass
class RankState:
    """What the agent knows of one live rank: its file's record and its rules' clocks."""

    record: dict[str, Any]
    rules: dict[str, RuleClock] = field(default_factory=dict)

    @property
    def rank(self) -> int:
        return int(self.record.get("rank", -1))


def settings_of(cluster: spec_mod.HangwatchSpec, ranks: list[RankState]) -> spec_mod.HangwatchSpec:
    """The cluster's defaults, then the job's submit-time settings, then the run's own (``configure``)."""
    first = min(ranks, key=lambda r: r.rank).record
    overrides = []
    for key in ("job_overrides", "run_overrides"):
        data = first.get(key)
        if isinstance(data, dict):
            try:
                overrides.append(spec_mod.HangOverrides.model_validate(data))
            except ValueError:
                continue  # validated where it was set; an unreadable one is not a reason to stop watching
    return cluster.merged(*overrides)


def timeout_of(settings: spec_mod.HangwatchSpec, record: dict[str, Any]) -> float:
    """How long the rank may go without progress: the start timeout before its first report, then the fixed
    timeout, or (adaptive) max(min_timeout, 5x the slowest step it took)."""
    if not record.get("reports"):
        return settings.start_timeout
    if settings.timeout is not None:
        return settings.timeout
    return max(settings.min_timeout, ADAPTIVE_FACTOR * float(record.get("slowest_step_s") or 0.0))


def stalled_for(record: dict[str, Any], now: float) -> float | None:
    """Seconds without progress (pauses not counted); None while paused."""
    if record.get("paused"):
        return None
    return max(0.0, now - float(record.get("clock") or now))


def evaluate(settings: spec_mod.HangwatchSpec, ranks: list[RankState], now: float) -> Verdict | None:
    """The run's verdict at ``now`` (None: not hung). Rule clocks' ``breaches`` are advanced here."""
    if not settings.enabled or not ranks:
        return None
    for state in ranks:
        for rule in settings.rules:
            clock = state.rules.get(rule.name)
            if clock is not None and clock.fault_line is not None and rule.enabled:
                return Verdict(
                    "fault",
                    f"rank {state.rank} logged a line matching fault rule '{rule.name}': {clock.fault_line[:300]}",
                    [state.rank],
                    float(state.record.get("clock") or now),
                    None,
                    rule.name,
                )
    stalls: list[tuple[RankState, float, float]] = []
    for state in ranks:
        stalled = stalled_for(state.record, now)
        limit = timeout_of(settings, state.record)
        if stalled is None or stalled < limit:
            stalls = []
            break
        stalls.append((state, stalled, limit))
    if stalls:
        worst = max(stalls, key=lambda item: item[1])
        phase = "start-up (no report yet)" if not worst[0].record.get("reports") else "training"
        ranks_text = ", ".join(str(s.rank) for s, _, _ in sorted(stalls, key=lambda item: -item[1]))
        return Verdict(
            "hang",
            f"no progress from rank(s) {ranks_text} for {worst[1]:.0f} s during {phase} (timeout {worst[2]:.0f} s)",
            [s.rank for s, _, _ in stalls],
            min(float(s.record.get("clock") or now) for s, _, _ in stalls),
            worst[2],
        )
    return _rule_verdict(settings, ranks, now)


def _rule_verdict(settings: spec_mod.HangwatchSpec, ranks: list[RankState], now: float) -> Verdict | None:
    for rule in settings.rules:
        if not rule.enabled or (rule.timeout_seconds is None and rule.start_timeout_seconds is None):
            continue
        for state in ranks:
            clock = state.rules.setdefault(rule.name, RuleClock())
            record = state.record
            if clock.stopped or record.get("paused") or record.get("finished"):
                clock.breaches = 0
                continue
            since = max(float(record.get("started") or now), float(record.get("resumed") or 0.0))
            if clock.last_match is None:
                reference, limit = since, rule.start_timeout_seconds or rule.timeout_seconds
            else:
                reference, limit = max(clock.last_match, since), rule.timeout_seconds
            if limit is None or now - reference < limit:
                clock.breaches = 0
                continue
            clock.breaches += 1
            if clock.breaches >= rule.metric_evaluation_data_points:
                what = "no first line" if clock.last_match is None else "no line"
                return Verdict(
                    "rule",
                    f"rule '{rule.name}': {what} matching its pattern on rank {state.rank} for {now - reference:.0f} s "
                    f"(limit {limit:.0f} s)",
                    [state.rank],
                    reference,
                    limit,
                    rule.name,
                )
    return None


def match_line(
    settings: spec_mod.HangwatchSpec, state: RankState, line: str, now: float, compiled: dict[str, Any]
) -> None:
    """Advance the rank's rule clocks for one log line. ``compiled`` caches RE2 patterns by text."""
    for rule in settings.rules:
        if not rule.enabled:
            continue
        clock = state.rules.setdefault(rule.name, RuleClock())
        if clock.stopped:
            continue
        if rule.stop_pattern is not None and _search(compiled, rule.stop_pattern, line):
            clock.stopped = True
            continue
        if _search(compiled, rule.log_pattern, line):
            clock.last_match, clock.breaches = now, 0
            if rule.fault_on_match and clock.fault_line is None:
                clock.fault_line = line


def _search(compiled: dict[str, Any], pattern: str, line: str) -> bool:
    from raypod.capabilities.hangwatch.logs import compile_pattern

    matcher = compiled.get(pattern)
    if matcher is None:
        matcher = compiled[pattern] = compile_pattern(pattern)
    return matcher.search(line) is not None
