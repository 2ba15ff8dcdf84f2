"""The pure verdicts: the cross-node no-progress verdict, and per-rank rules on one node."""

from __future__ import annotations

from typing import Any

import pytest

from raypod import spec as spec_mod
from raypod.capabilities.hangwatch import detector

NOW = 10_000.0


def record(rank: int = 0, **fields: Any) -> dict[str, Any]:
    return {"rank": rank, "pid": 100 + rank, "started": NOW - 100, "clock": NOW - 5, "reports": 3, **fields}


def view(rank: int, stalled: float | None, timeout: float = 10.0, reports: int = 3) -> detector.RankView:
    return detector.RankView(rank, stalled, timeout, reports, NOW - (stalled or 0))


@pytest.mark.parametrize(
    ("ranks", "world", "hung"),
    [
        ([view(0, 11), view(1, 12)], 2, True),
        ([view(0, 11), view(1, 5)], 2, False),  # one rank still moves
        ([view(0, 11), view(1, None)], 2, False),  # rank 1 saves a checkpoint: rank 0 waits for it
        ([view(0, 11)], 2, False),  # rank 1 unseen: unknown, not hung
        ([view(0, 11, reports=0)], 1, True),
        ([], 1, False),
    ],
)
def test_a_run_is_hung_only_when_every_rank_everywhere_is_stalled_and_none_paused(
    ranks: list[detector.RankView], world: int, hung: bool
) -> None:
    verdict = detector.hang_verdict(ranks, world)
    assert (verdict is not None) is hung
    if verdict is not None and len(ranks) == 2:
        assert verdict.ranks[0] == 1 and "rank 1 stalled first" in verdict.reason


def test_timeouts_start_grace_fixed_and_adaptive() -> None:
    fixed = spec_mod.HangwatchSpec(timeout="30s", start_timeout="5m")
    adaptive = spec_mod.HangwatchSpec(min_timeout="60s")
    assert detector.timeout_of(fixed, record(reports=0)) == 300
    assert detector.timeout_of(fixed, record(slowest_step_s=100)) == 30
    assert detector.timeout_of(adaptive, record(slowest_step_s=2)) == 60
    assert detector.timeout_of(adaptive, record(slowest_step_s=40)) == 200
    assert detector.stalled_for(record(paused="checkpoint"), NOW) is None
    assert detector.stalled_for(record(), NOW) == 5


def settings(*rules: dict[str, Any]) -> spec_mod.HangwatchSpec:
    return spec_mod.HangwatchSpec(rules=[spec_mod.HangRuleSpec.model_validate(r) for r in rules])


def feed(config: spec_mod.HangwatchSpec, state: detector.RankState, lines: list[str], at: float) -> None:
    cache: dict[str, Any] = {}
    for line in lines:
        detector.match_line(config, state, line, at, cache)


def test_a_fault_line_is_a_verdict_at_once_and_a_non_fault_match_is_not() -> None:
    config = settings(
        {"name": "oom", "log_pattern": "CUDA out of memory", "fault_on_match": True},
        {"name": "warn", "log_pattern": "near out of memory", "fault_on_match": False},
    )
    quiet = detector.RankState(record(1))
    feed(config, quiet, ["near out of memory, shrinking the batch"], NOW)
    assert detector.evaluate(config, [quiet], NOW) is None
    faulty = detector.RankState(record(1))
    feed(config, faulty, ["step 3", "RuntimeError: CUDA out of memory. Tried to allocate"], NOW)
    verdict = detector.evaluate(config, [faulty], NOW)
    assert verdict is not None and verdict.kind == "fault" and verdict.rule == "oom" and verdict.ranks == [1]


def test_a_rule_timeout_fires_after_its_data_points_and_a_stop_pattern_ends_the_watch() -> None:
    config = settings(
        {
            "name": "step",
            "log_pattern": r"step \d+",
            "timeout_seconds": 30,
            "start_timeout_seconds": 60,
            "stop_pattern": "Training complete",
            "metric_evaluation_data_points": 2,
        }
    )
    state = detector.RankState(record(0, started=NOW - 50))
    assert detector.evaluate(config, [state], NOW) is None  # within the start timeout
    assert detector.evaluate(config, [state], NOW + 20) is None  # first breach of two
    verdict = detector.evaluate(config, [state], NOW + 21)
    assert verdict is not None and verdict.kind == "rule" and "no first line" in verdict.reason
    feed(config, state, ["step 7"], NOW + 22)
    assert detector.evaluate(config, [state], NOW + 40) is None
    assert detector.evaluate(config, [state], NOW + 53) is None  # one breach
    assert detector.evaluate(config, [state], NOW + 54) is not None
    feed(config, state, ["Training complete"], NOW + 55)
    assert detector.evaluate(config, [state], NOW + 500) is None
    paused = detector.RankState(record(0, started=NOW - 500, paused="evaluation"))
    assert detector.evaluate(config, [paused], NOW) is None


def test_a_disabled_rule_or_watch_gives_no_verdict() -> None:
    config = settings({"name": "oom", "log_pattern": "oom", "fault_on_match": True, "enabled": False})
    state = detector.RankState(record())
    feed(config, state, ["oom"], NOW)
    assert detector.evaluate(config, [state], NOW) is None
    off = spec_mod.HangwatchSpec(enabled=False)
    assert detector.evaluate(off, [state], NOW) is None


def test_the_action_turns_to_failing_the_job_past_the_hangs_in_a_row_allowed() -> None:
    cancel = spec_mod.HangwatchSpec(action="cancel", max_hang_restarts=2)
    assert [detector.action_for(cancel, n) for n in (1, 2, 3)] == ["cancel", "cancel", "fail-job"]
    assert detector.action_for(spec_mod.HangwatchSpec(), 9) == "notify"


def test_settings_come_from_the_cluster_then_the_job_then_the_run() -> None:
    ranks = [
        detector.RankState(
            record(0, job_overrides={"action": "cancel", "timeout": 60}, run_overrides={"timeout": 120})
        ),
        detector.RankState(record(1)),
    ]
    merged = detector.settings_of(spec_mod.HangwatchSpec(), ranks)
    assert merged.action is spec_mod.HangAction.CANCEL and merged.timeout == 120
