"""The health model, pure: signal results in, a node's health out. No I/O and no clock of its own.

Each signal keeps counts of failures and good answers in a row. A signal is *failing* once it has failed its
threshold of times in a row, and stays failing until it has answered well ``recovery_threshold`` times in a row:
a node that flaps between good and bad answers does not flap between verdicts. A signal without an answer this
time (not applicable, not observable) changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

from raypod.state import NodeHealthState

# Signals that say whether the node still answers: while one of them fails, draining it would only wait.
LIVENESS_SIGNALS = frozenset({"process", "ray", "agent"})


class Level(StrEnum):
    OK = "ok"
    WARN = "warn"  # advisory: at most suspect, never unhealthy (replacing the node would not help)
    FAIL = "fail"


@dataclass(frozen=True)
class SignalResult:
    """One answer of one signal for one node. ``level`` None: no answer this time (changes nothing)."""

    signal: str
    level: Level | None
    detail: str = ""
    threshold: int = 1  # failures in a row that make the signal failing


@dataclass(frozen=True)
class SignalState:
    level: Level
    detail: str = ""
    failures: int = 0
    successes: int = 0
    failing: bool = False


@dataclass(frozen=True)
class NodeHealth:
    state: NodeHealthState
    signals: Mapping[str, SignalState] = field(default_factory=dict)

    @property
    def reasons(self) -> list[str]:
        """One line per signal that is not fine, failing ones first."""
        bad = [(not s.failing, name, s) for name, s in self.signals.items() if s.failing or s.level is not Level.OK]
        return [f"{name}: {s.detail}" if s.detail else name for _, name, s in sorted(bad)]

    @property
    def answers(self) -> bool:
        """Whether the node still responds (no liveness signal failing): then it can be drained before removal."""
        return not any(s.failing for name, s in self.signals.items() if name in LIVENESS_SIGNALS)


UNASSESSED = NodeHealth(NodeHealthState.UNKNOWN)


@dataclass(frozen=True)
class Verdict:
    """What the planner needs of a node's health: that it should go, why, and whether it can be drained first."""

    reason: str
    answers: bool


def assess(previous: NodeHealth | None, results: Iterable[SignalResult], *, recovery_threshold: int) -> NodeHealth:
    """Fold this pass's signal results into the node's previous health."""
    signals = dict(previous.signals if previous is not None else {})
    for result in results:
        if result.level is None:
            continue
        signals[result.signal] = _step(signals.get(result.signal), result, recovery_threshold)
    return NodeHealth(_state(signals.values()), signals)


def verdict(health: NodeHealth) -> Verdict | None:
    """A verdict for an unhealthy node, None otherwise."""
    if health.state is not NodeHealthState.UNHEALTHY:
        return None
    return Verdict(reason="; ".join(health.reasons), answers=health.answers)


def _step(before: SignalState | None, result: SignalResult, recovery_threshold: int) -> SignalState:
    state = before or SignalState(level=Level.OK)
    if result.level is Level.FAIL:
        failures = state.failures + 1
        return SignalState(
            level=Level.FAIL,
            detail=result.detail,
            failures=failures,
            successes=0,
            failing=state.failing or failures >= result.threshold,
        )
    if result.level is Level.WARN:
        return replace(state, level=Level.WARN, detail=result.detail, failures=0, successes=0)
    successes = state.successes + 1
    failing = state.failing and successes < recovery_threshold
    # An advisory signal clears with the same hysteresis, so a reading near its threshold does not flap.
    warned = state.level is Level.WARN and successes < recovery_threshold
    return SignalState(
        level=Level.WARN if warned else Level.OK,
        detail=state.detail if failing or warned else "",
        failures=0,
        successes=successes,
        failing=failing,
    )


def _state(signals: Iterable[SignalState]) -> NodeHealthState:
    found = list(signals)
    if any(s.failing for s in found):
        return NodeHealthState.UNHEALTHY
    if any(s.level is not Level.OK for s in found):
        return NodeHealthState.SUSPECT
    return NodeHealthState.HEALTHY
