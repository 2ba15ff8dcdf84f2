"""The health model: thresholds, hysteresis, advisory signals, and what the planner gets out of it."""

from __future__ import annotations

from raypod.capabilities.resilience import model
from raypod.state import NodeHealthState as H

FAIL, OK, WARN = model.Level.FAIL, model.Level.OK, model.Level.WARN


def run(levels: list[model.Level | None], *, threshold: int = 3, recovery: int = 2) -> list[H]:
    health = None
    states = []
    for level in levels:
        result = model.SignalResult("agent", level, "no answer" if level is FAIL else "", threshold)
        health = model.assess(health, [result], recovery_threshold=recovery)
        states.append(health.state)
    return states


def test_failures_below_the_threshold_are_suspect_then_unhealthy() -> None:
    assert run([OK, FAIL, FAIL, FAIL]) == [H.HEALTHY, H.SUSPECT, H.SUSPECT, H.UNHEALTHY]


def test_one_good_answer_resets_the_count_of_failures() -> None:
    assert run([FAIL, FAIL, OK, FAIL, FAIL]) == [H.SUSPECT, H.SUSPECT, H.HEALTHY, H.SUSPECT, H.SUSPECT]


def test_an_unhealthy_signal_needs_several_good_answers_in_a_row_to_recover() -> None:
    states = run([FAIL, FAIL, FAIL, OK, FAIL, OK, OK], threshold=3, recovery=2)
    assert states == [H.SUSPECT, H.SUSPECT, H.UNHEALTHY, H.UNHEALTHY, H.UNHEALTHY, H.UNHEALTHY, H.HEALTHY]


def test_no_answer_changes_nothing() -> None:
    assert run([FAIL, None, FAIL, None, FAIL]) == [H.SUSPECT, H.SUSPECT, H.SUSPECT, H.SUSPECT, H.UNHEALTHY]


def test_an_advisory_signal_makes_a_node_suspect_never_unhealthy_and_clears_with_hysteresis() -> None:
    assert run([WARN] * 10, threshold=1) == [H.SUSPECT] * 10
    assert run([WARN, OK, WARN, OK, OK, OK], recovery=2) == [
        H.SUSPECT,
        H.SUSPECT,
        H.SUSPECT,
        H.SUSPECT,
        H.HEALTHY,
        H.HEALTHY,
    ]


def test_reasons_name_each_signal_and_liveness_decides_whether_it_answers() -> None:
    health = model.assess(
        None,
        [
            model.SignalResult("check:gpu-burn", FAIL, "exit 1: ECC", 1),
            model.SignalResult("agent", OK),
            model.SignalResult("host-memory", WARN, "host has 100 MiB of 24000 MiB available"),
        ],
        recovery_threshold=2,
    )
    assert health.state is H.UNHEALTHY
    assert health.reasons == ["check:gpu-burn: exit 1: ECC", "host-memory: host has 100 MiB of 24000 MiB available"]
    verdict = model.verdict(health)
    assert verdict is not None and verdict.answers, "only a failing check: the node answers, so it can be drained"
    frozen = model.assess(health, [model.SignalResult("agent", FAIL, "no answer", 1)], recovery_threshold=2)
    assert model.verdict(frozen) == model.Verdict(
        reason=frozen.reasons[0] + "; " + frozen.reasons[1] + "; " + frozen.reasons[2], answers=False
    )
    assert model.verdict(model.assess(None, [model.SignalResult("agent", OK)], recovery_threshold=2)) is None
