"""Pure: is a Ray Train run hung, and why. No I/O, no clock (``now`` is passed in).

A rank makes progress when a ``ray.train.report`` returns. A run is hung when every one of its ranks has gone
without progress for the run's timeout (before its first report: the start timeout) and none of them is paused
(a checkpoint being saved, ``raypod.hangwatch.paused()``): ``hang_verdict``, which the control plane applies
across the run's nodes. Rules are per rank and need no other node: ``evaluate``, which each node's agent applies
to its own ranks (a fault line is acted on at once).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from raypod import spec as spec_mod
from raypod.capabilities.hangwatch import logs

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


@dataclass(frozen=True)
class RankView:
    """One rank as the control plane sees it from its node's agent (the inputs of ``hang_verdict``)."""

    rank: int
    stalled_s: float | None  # None: paused
    timeout_s: float
    reports: int
    last_progress: float


def action_for(settings: spec_mod.HangwatchSpec, count: int) -> str:
    """notify; cancel; or, past ``max_hang_restarts`` in a row with no progress, fail-job (a restart loop helps
    no one)."""
    if settings.action is not spec_mod.HangAction.CANCEL:
        return "notify"
    return "fail-job" if count > settings.max_hang_restarts else "cancel"


def hang_verdict(ranks: list[RankView], world_size: int) -> Verdict | None:
    """A run is hung when every one of its ``world_size`` ranks, on every node, has gone without progress for
    its timeout and none is paused. A rank not seen (its node's agent silent) makes the answer unknown: None.

    One node alone cannot tell: while rank 0 saves a checkpoint (paused), rank 1 waits in the next collective,
    as stuck-looking as in a real hang."""
    if not ranks or len({r.rank for r in ranks}) < world_size:
        return None
    if any(r.stalled_s is None or r.stalled_s < r.timeout_s for r in ranks):
        return None
    ordered = sorted(ranks, key=lambda r: r.last_progress)
    worst = max(ranks, key=lambda r: r.stalled_s or 0.0)
    phase = "start-up (no report yet)" if not worst.reports else "training"
    return Verdict(
        "hang",
        f"no progress from any of the {world_size} ranks for {worst.stalled_s or 0.0:.0f} s during {phase} "
        f"(timeout {worst.timeout_s:.0f} s); rank {ordered[0].rank} stalled first",
        [r.rank for r in ordered],
        ordered[0].last_progress,
        worst.timeout_s,
    )


def evaluate(settings: spec_mod.HangwatchSpec, ranks: list[RankState], now: float) -> Verdict | None:
    """The verdict of a run's rules on this node's ranks at ``now``: a fault line, or a rule's timeout (None:
    neither). Rule clocks' ``breaches`` are advanced here. The no-progress verdict spans nodes: ``hang_verdict``."""
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
    matcher = compiled.get(pattern)
    if matcher is None:
        matcher = compiled[pattern] = logs.compile_pattern(pattern)
    return matcher.search(line) is not None
