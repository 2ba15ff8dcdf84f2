"""Hang detection's settings (``hangwatch`` in a cluster spec) and the rules and overrides a job may carry."""

from __future__ import annotations

import math
import re
from enum import StrEnum
from typing import Annotated, Any

import yaml
from pydantic import (
    BeforeValidator,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from raypod.spec.values import (
    Strict,
    describe_validation_error,
    parse_duration,
)


class HangAction(StrEnum):
    NOTIFY = "notify"  # an event, a metric, a line in the job's log, the webhook
    CANCEL = "cancel"  # all of that, then the hung ranks are killed so Ray Train's FailureConfig restarts the run


MAX_HANG_RULES = 32
MAX_RULE_PATTERN = 256
HANG_RULE_FIELDS = (
    "name",
    "type",
    "enabled",
    "log_pattern",
    "timeout_seconds",
    "start_timeout_seconds",
    "stop_pattern",
    "metric_evaluation_data_points",
    "fault_on_match",
)
_RULE_MINUTES = {"timeout_minutes": "timeout_seconds", "start_timeout_minutes": "start_timeout_seconds"}


def _check_re2(pattern: str, where: str) -> None:
    import re2  # google-re2: linear-time matching, so no pattern can stall the agent

    if len(pattern) > MAX_RULE_PATTERN:
        raise ValueError(f"{where} is {len(pattern)} characters; at most {MAX_RULE_PATTERN}")
    try:
        re2.compile(pattern)
    except re2.error as exc:
        raise ValueError(f"{where} is not valid RE2 syntax: {exc}") from None


class HangRuleSpec(Strict):
    """A log rule, field for field what hang-detection toolkits' rule files have (docs/hangwatch.md).

    ``timeout_*``: a line matching ``log_pattern`` must appear at least that often once the first one did;
    ``start_timeout_*``: the first one must appear that soon after the rank starts; ``fault_on_match``: a match
    is a fault at once (an OOM or NCCL error line); ``stop_pattern``: a matching line ends the rule's watch;
    ``metric_evaluation_data_points``: breaches in a row (one per agent poll) before the rule fires.
    """

    name: str = Field(min_length=1, max_length=64)
    type: str = Field("log_pattern", description="The one rule type: log_pattern.")
    enabled: bool = True
    log_pattern: str = Field(min_length=1)
    timeout_seconds: float | None = Field(None, ge=0, le=30 * 86400)
    start_timeout_seconds: float | None = Field(None, ge=0, le=30 * 86400)
    stop_pattern: str | None = None
    metric_evaluation_data_points: int = Field(1, ge=1, le=1000)
    fault_on_match: bool = False

    @model_validator(mode="before")
    @classmethod
    def _toolkit_fields(cls, data: Any) -> Any:
        """Unknown fields and bad numbers are named with the rule; ``*_minutes`` become ``*_seconds``."""
        if not isinstance(data, dict):
            raise ValueError(f"a rule must be a mapping of fields, got {type(data).__name__}")
        name = data.get("name")
        where = f"rule '{name}'" if isinstance(name, str) and name else "rule (no name)"
        fields = dict(data)
        for minutes, seconds in _RULE_MINUTES.items():
            if minutes in fields:
                if seconds in fields:
                    raise ValueError(f"{where}: give {minutes} or {seconds}, not both")
                value = fields.pop(minutes)
                fields[seconds] = None if value is None else _rule_number(value, where, minutes) * 60
            elif fields.get(seconds) is not None:
                fields[seconds] = _rule_number(fields[seconds], where, seconds)
        unknown = sorted(set(fields) - set(HANG_RULE_FIELDS))
        if unknown:
            raise ValueError(
                f"{where}: unknown field '{unknown[0]}' (fields: {', '.join(HANG_RULE_FIELDS)}, or the "
                "*_minutes variants)"
            )
        if fields.get("type", "log_pattern") != "log_pattern":
            raise ValueError(f"{where}: unknown type '{fields['type']}' (the one type is log_pattern)")
        points = fields.get("metric_evaluation_data_points")
        if isinstance(points, int | float) and not isinstance(points, bool) and points < 1:
            raise ValueError(f"{where}: metric_evaluation_data_points must be >= 1")
        return fields

    @model_validator(mode="after")
    def _patterns(self) -> HangRuleSpec:
        where = f"rule '{self.name}'"
        _check_re2(self.log_pattern, f"{where}: log_pattern")
        if self.stop_pattern is not None:
            _check_re2(self.stop_pattern, f"{where}: stop_pattern")
        return self


def _rule_number(value: Any, where: str, field_name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{where}: {field_name} must be a number, got {value!r}")
    if value < 0 or not math.isfinite(value):
        raise ValueError(f"{where}: {field_name} must be >= 0, got {value}")
    return float(value)


def _check_rule_names(rules: list[HangRuleSpec]) -> list[HangRuleSpec]:
    names = [rule.name for rule in rules]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"rule names must be unique, repeated: {', '.join(repeated)}")
    return rules


def _timeout_or_adaptive(value: Any) -> float | None:
    if value is None or (isinstance(value, str) and value.strip().lower() == "adaptive"):
        return None
    return parse_duration(value)


Timeout = Annotated[float | None, BeforeValidator(_timeout_or_adaptive)]
Duration = Annotated[float, BeforeValidator(parse_duration)]


class HangOverrides(Strict):
    """What one job (submit-time metadata) or one run (``raypod.hangwatch.configure``) sets over the cluster's
    defaults; unset fields inherit."""

    enabled: bool | None = None
    timeout: Timeout = Field(None, description="Seconds, a duration ('15m'), or 'adaptive'.")
    start_timeout: Duration | None = Field(None, le=7 * 86400)
    action: HangAction | None = None
    rules: list[HangRuleSpec] | None = Field(None, max_length=MAX_HANG_RULES)
    max_hang_restarts: int | None = Field(None, ge=0, le=100)

    @field_validator("rules")
    @classmethod
    def _unique_rules(cls, value: list[HangRuleSpec] | None) -> list[HangRuleSpec] | None:
        return None if value is None else _check_rule_names(value)


class HangwatchSpec(Strict):
    """Hung-job detection for Ray Train runs: a cluster's defaults, which jobs and runs may override."""

    enabled: bool = Field(True, description="Run the monitoring agent on every node.")
    timeout: Timeout = Field(
        None,
        description="No progress of any rank for this long is a hang. Unset or 'adaptive': max(min_timeout, "
        "5x the slowest step seen).",
    )
    min_timeout: Duration = Field(600.0, gt=0, le=7 * 86400, description="The floor of the adaptive timeout.")
    start_timeout: Duration = Field(
        1200.0, gt=0, le=7 * 86400, description="Grace before a rank's first report (start-up, data loading)."
    )
    action: HangAction = HangAction.NOTIFY
    rules: list[HangRuleSpec] = Field(default_factory=list, max_length=MAX_HANG_RULES)
    max_hang_restarts: int = Field(
        3, ge=0, le=100, description="Cancels of one run with no progress in between before its job is failed."
    )
    poll: Duration = Field(2.0, ge=0.2, le=60, description="How often each node's agent looks.")
    webhook_url: str | None = Field(None, max_length=2048, description="POSTed a JSON detection (http/https).")

    @field_validator("rules")
    @classmethod
    def _unique_rules(cls, value: list[HangRuleSpec]) -> list[HangRuleSpec]:
        return _check_rule_names(value)

    @field_validator("webhook_url")
    @classmethod
    def _webhook(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^\s/?#]+[^\s]*$", value):
            raise ValueError(f"webhook_url '{value[:80]}' must be an http:// or https:// URL")
        return value

    def merged(self, *overrides: HangOverrides | None) -> HangwatchSpec:
        """These defaults with each override applied in turn (the last wins)."""
        data = self.model_dump()
        for override in overrides:
            if override is not None:
                data.update(override.model_dump(exclude_unset=True))
        return HangwatchSpec.model_validate(data)


# Job metadata keys a plain ``ray job submit --metadata-json`` can set, as the CLI's --hang-* flags do.
HANG_METADATA = {
    "raypod.hang_timeout": "timeout",
    "raypod.hang_start_timeout": "start_timeout",
    "raypod.hang_action": "action",
    "raypod.hang_rules": "rules",
    "raypod.hang_max_restarts": "max_hang_restarts",
    "raypod.hang_enabled": "enabled",
}
MAX_HANG_RULES_METADATA = 32 * 1024


def load_hang_rules(text: str) -> list[HangRuleSpec]:
    """Rules from a YAML or JSON document: a list of rules, or a mapping with a ``rules`` list.

    Raises:
        ValueError: not YAML/JSON, not rules, or a rule that is invalid (the message names it and its field).
    """
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"hang rules are not valid YAML or JSON: {exc}") from None
    if isinstance(data, dict) and set(data) == {"rules"}:
        data = data["rules"]
    if not isinstance(data, list):
        raise ValueError("hang rules must be a list of rules (or a mapping with a 'rules' list)")
    return parse_hang_overrides({"rules": data}).rules or []


def parse_hang_overrides(data: dict[str, Any]) -> HangOverrides:
    """Raises: ValueError with one line per problem, each naming the rule or field."""
    try:
        return HangOverrides.model_validate(data)
    except ValidationError as exc:
        raise ValueError(describe_validation_error(exc)) from None


def hang_overrides_from_metadata(metadata: dict[str, str]) -> HangOverrides | None:
    """The hang settings a job's metadata carries (None: none).

    Raises:
        ValueError: a key with a bad value, naming the key (and the rule and field).
    """
    found: dict[str, Any] = {}
    for key, field_name in HANG_METADATA.items():
        if key not in metadata:
            continue
        value: Any = metadata[key]
        if field_name == "rules":
            if len(value) > MAX_HANG_RULES_METADATA:
                raise ValueError(f"{key}: over {MAX_HANG_RULES_METADATA // 1024} KiB")
            try:
                value = [rule.model_dump(exclude_defaults=True) for rule in load_hang_rules(value)]
            except ValueError as exc:
                raise ValueError(f"{key}: {exc}") from None
        elif field_name == "enabled":
            value = str(value).strip().lower() in ("1", "true", "yes", "on")
        found[field_name] = value
    if not found:
        return None
    try:
        return parse_hang_overrides(found)
    except ValueError as exc:
        raise ValueError(f"job metadata raypod.hang_*: {exc}") from None
