"""Hang rules and settings: a toolkit's rule file works unchanged; every bad rule is refused naming rule and field."""

from __future__ import annotations

import json
import time
import warnings

import pytest

import raypod.hangwatch
from raypod import spec as spec_mod

TOOLKIT_RULES = """
- name: training-step
  type: log_pattern
  enabled: true
  log_pattern: '.*Epoch \\d+ step \\d+.*'
  start_timeout_minutes: 10
  timeout_minutes: 5
  stop_pattern: 'Training complete'
  metric_evaluation_data_points: 2
- name: nccl-error
  log_pattern: 'NCCL error|CUDA out of memory'
  fault_on_match: true
- name: heartbeat
  log_pattern: 'heartbeat'
  timeout_seconds: 90
"""


def test_a_toolkit_rule_file_loads_unchanged_with_minutes_as_seconds() -> None:
    rules = spec_mod.load_hang_rules(TOOLKIT_RULES)
    assert [r.name for r in rules] == ["training-step", "nccl-error", "heartbeat"]
    assert rules[0].timeout_seconds == 300 and rules[0].start_timeout_seconds == 600
    assert rules[0].metric_evaluation_data_points == 2 and rules[0].stop_pattern == "Training complete"
    assert rules[1].fault_on_match and rules[1].timeout_seconds is None
    assert rules[2].timeout_seconds == 90
    assert spec_mod.load_hang_rules(json.dumps({"rules": [{"name": "a", "log_pattern": "x"}]}))[0].name == "a"


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        ({"name": "r1", "log_pattern": "x", "colour": "red"}, ["r1", "unknown field 'colour'"]),
        ({"name": "r2", "type": "metric", "log_pattern": "x"}, ["r2", "unknown type 'metric'"]),
        ({"name": "r3", "log_pattern": "a" * 257}, ["r3", "log_pattern", "257 characters"]),
        ({"name": "r4", "log_pattern": "(unclosed"}, ["r4", "log_pattern", "RE2"]),
        ({"name": "r5", "log_pattern": "x", "stop_pattern": "(?<=lookbehind)"}, ["r5", "stop_pattern", "RE2"]),
        ({"name": "r6", "log_pattern": "x", "timeout_minutes": -1}, ["r6", "timeout_minutes", ">= 0"]),
        ({"name": "r7", "log_pattern": "x", "start_timeout_seconds": -5}, ["r7", "start_timeout_seconds"]),
        ({"name": "r8", "log_pattern": "x", "timeout_minutes": 1, "timeout_seconds": 60}, ["r8", "not both"]),
        ({"name": "r9", "log_pattern": "x", "metric_evaluation_data_points": 0}, ["r9", "data_points"]),
        ({"name": "r10", "log_pattern": "x", "timeout_minutes": "soon"}, ["r10", "timeout_minutes", "number"]),
    ],
)
def test_a_bad_rule_is_refused_naming_the_rule_and_the_field(rule: dict[str, object], expected: list[str]) -> None:
    with pytest.raises(ValueError) as refused:
        spec_mod.load_hang_rules(json.dumps([rule]))
    for text in expected:
        assert text in str(refused.value)


def test_repeated_rule_names_and_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="repeated: a"):
        spec_mod.load_hang_rules('[{"name": "a", "log_pattern": "x"}, {"name": "a", "log_pattern": "y"}]')
    with pytest.raises(ValueError, match="action"):
        spec_mod.hang_overrides_from_metadata({"raypod.hang_action": "explode"})
    with pytest.raises(ValueError, match="timeout"):
        spec_mod.hang_overrides_from_metadata({"raypod.hang_timeout": "-3m"})
    with pytest.raises(ValueError, match=r"raypod\.hang_rules"):
        spec_mod.JobSpec(entrypoint="x", metadata={"raypod.hang_rules": "[{name: a}]"})


def test_job_metadata_and_run_settings_override_the_cluster_defaults_in_order() -> None:
    cluster = spec_mod.HangwatchSpec(timeout="20m", action="notify")
    job = spec_mod.hang_overrides_from_metadata({"raypod.hang_timeout": "15m", "raypod.hang_action": "cancel"})
    run = spec_mod.parse_hang_overrides({"timeout": "adaptive"})
    merged = cluster.merged(job, run)
    assert merged.action is spec_mod.HangAction.CANCEL and merged.timeout is None
    assert cluster.merged(job).timeout == 900
    assert spec_mod.parse_duration("1.5h") == 5400 and spec_mod.parse_duration(90) == 90


def test_a_pattern_that_backtracks_forever_in_python_matches_in_linear_time() -> None:
    from raypod.capabilities.hangwatch.logs import compile_pattern

    matcher = compile_pattern(spec_mod.load_hang_rules('[{"name": "evil", "log_pattern": "(a+)+$"}]')[0].log_pattern)
    line = "a" * 100_000 + "!"
    started = time.perf_counter()
    assert matcher.search(line) is None
    assert time.perf_counter() - started < 0.5


def test_configure_validates_and_is_a_warning_only_no_op_outside_a_raypod_rank(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(raypod.hangwatch, "_warned", False)
    with pytest.raises(ValueError, match=r"rule 'bad'.*log_pattern"):
        raypod.hangwatch.configure(rules=[{"name": "bad", "log_pattern": "("}])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        raypod.hangwatch.configure(rules=[{"name": "ok", "log_pattern": "step"}], action="cancel", timeout="5m")
        raypod.hangwatch.configure(action="notify")
    assert [str(w.message) for w in caught if "no raypod agent" in str(w.message)] == [str(caught[0].message)]
    assert len(caught) == 1
    with raypod.hangwatch.paused("evaluation"):
        pass
