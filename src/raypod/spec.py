"""Desired state: what a user asks for. Pure data and validation, no I/O.

A ``ClusterSpec`` describes one Ray cluster independently of where it runs: the local backend turns it into
``ray start`` processes, the KubeRay manifests turn it into a ``ray.io/v1`` ``RayCluster``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Annotated, Any

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    field_validator,
    model_validator,
)

from raypod import addons as addons_mod
from raypod import errors

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
RESOURCE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.:/-]{0,62}$")

MAX_REPLICAS = 1000
MAX_WORKER_GROUPS = 32
MAX_CPUS_PER_NODE = 1024
MAX_GPUS_PER_NODE = 64
MAX_ENV_VARS = 256
MAX_ENV_VALUE_BYTES = 32 * 1024
MAX_ENV_BYTES = 96 * 1024
MAX_RUNTIME_ENV_BYTES = 64 * 1024
RAY_BUILTIN_RESOURCES = frozenset({"CPU", "GPU", "memory", "object_store_memory"})
RESERVED_LABEL_PREFIXES = ("ray.io/", "raypod.io/")
HEAD_GROUP = "headgroup"
SPACE_GROUP = "space"  # a workspace's node is ``space-<name>`` (capabilities/spaces)
SPACE_LABEL = "raypod.io/space"
SPACE_OBJECT_STORE_BYTES = 128 * 2**20  # a driver's own puts; results come from the workers' stores
MAX_SPACES = 16
DEFAULT_RAY_VERSION = "2.60.0"

_UNITS = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}
_QUANTITY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(|k|M|G|T|Ki|Mi|Gi|Ti)\s*$")


def parse_bytes(value: Any) -> int:
    """Parse a Kubernetes-style byte quantity ("2Gi", "512Mi", "1G", 1073741824) into bytes."""
    if isinstance(value, bool):
        raise ValueError("a byte quantity cannot be a boolean")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("a byte quantity must be a finite number")
    if isinstance(value, int | float):
        number = int(value)
    elif isinstance(value, str):
        match = _QUANTITY.match(value)
        if not match:
            raise ValueError(f"'{value}' is not a byte quantity (examples: 512Mi, 2Gi, 1G, 1073741824)")
        scaled = float(match.group(1)) * _UNITS[match.group(2)]
        if not math.isfinite(scaled):
            raise ValueError(f"'{value[:40]}' is too large a byte quantity")
        number = int(scaled)
    else:
        raise ValueError(f"'{value}' is not a byte quantity")
    if number < 0:
        raise ValueError("a byte quantity cannot be negative")
    return number


def format_bytes(number: int) -> str:
    """Format bytes as the shortest exact Kubernetes quantity ("2Gi", "300Mi", "1500")."""
    for unit in ("Ti", "Gi", "Mi", "Ki"):
        if number and number % _UNITS[unit] == 0:
            return f"{number // _UNITS[unit]}{unit}"
    return str(number)


ByteSize = Annotated[int, BeforeValidator(parse_bytes), PlainSerializer(format_bytes, return_type=str)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class NodeGroupSpec(_Strict):
    """Resources and labels of every node of a group."""

    cpus: int = Field(1, ge=0, le=MAX_CPUS_PER_NODE, description="Logical CPUs Ray schedules on.")
    memory: ByteSize = Field(2**30, description="Memory Ray schedules tasks against (Ray's `memory`).")
    object_store_memory: ByteSize = Field(256 * 2**20, description="Plasma object store size.")
    gpus: int = Field(0, ge=0, le=MAX_GPUS_PER_NODE)
    resources: dict[str, float] = Field(default_factory=dict, description="Custom Ray resources.")
    labels: dict[str, str] = Field(default_factory=dict, description="Ray node labels.")

    @field_validator("object_store_memory")
    @classmethod
    def _object_store_floor(cls, value: int) -> int:
        if value < 80 * 2**20:
            raise ValueError("object_store_memory must be at least 80Mi (Ray's minimum is 75 MB)")
        return value

    @field_validator("resources")
    @classmethod
    def _custom_resources(cls, value: dict[str, float]) -> dict[str, float]:
        for name, amount in value.items():
            if name in RAY_BUILTIN_RESOURCES:
                raise ValueError(f"resource '{name}' is built in: use the cpus/gpus/memory fields instead")
            if not RESOURCE_NAME.match(name):
                raise ValueError(f"resource name '{name}' must start with a letter and use [A-Za-z0-9_.:/-]")
            if not 0 <= amount <= 1_000_000:
                raise ValueError(f"resource '{name}' must be between 0 and 1000000, got {amount}")
        return value

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        for key, label in value.items():
            if not LABEL_KEY.match(key):
                raise ValueError(f"label key '{key}' is not a valid Kubernetes/Ray label key")
            if key.startswith(RESERVED_LABEL_PREFIXES):
                raise ValueError(f"label key '{key}' uses a reserved prefix ({', '.join(RESERVED_LABEL_PREFIXES)})")
            if not LABEL_VALUE.match(label):
                raise ValueError(f"label value '{label}' of '{key}' must be <= 63 characters of [A-Za-z0-9_.-]")
        return value


class HeadGroupSpec(NodeGroupSpec):
    """The head node: GCS, dashboard and job API live here."""


class WorkerGroupSpec(NodeGroupSpec):
    """A named group of identical worker nodes, scaled by ``replicas`` within ``[min_replicas, max_replicas]``."""

    name: str = Field(description="Group name (DNS-1123 label), also the `ray.io/node-group` label.")
    replicas: int = Field(1, ge=0, le=MAX_REPLICAS)
    min_replicas: int | None = Field(None, ge=0, le=MAX_REPLICAS, description="Defaults to replicas.")
    max_replicas: int | None = Field(None, ge=0, le=MAX_REPLICAS, description="Defaults to replicas.")

    @field_validator("name")
    @classmethod
    def _group_name(cls, value: str) -> str:
        _check_dns_label(value, "worker group name", max_len=40)
        if value == HEAD_GROUP:
            raise ValueError(f"worker group name '{HEAD_GROUP}' is reserved for the head")
        if value == SPACE_GROUP:
            raise ValueError(f"worker group name '{SPACE_GROUP}' is reserved for workspaces")
        return value

    @model_validator(mode="after")
    def _bounds(self) -> WorkerGroupSpec:
        lower, upper = self.effective_min_replicas, self.effective_max_replicas
        if lower > upper:
            raise ValueError(f"group '{self.name}': min_replicas {lower} > max_replicas {upper}")
        if not lower <= self.replicas <= upper:
            raise ValueError(f"group '{self.name}': replicas {self.replicas} outside [{lower}, {upper}]")
        return self

    @property
    def effective_min_replicas(self) -> int:
        """Without an explicit bound the group is fixed-size: it follows ``replicas``."""
        if self.min_replicas is not None:
            return self.min_replicas
        return min(self.replicas, self.max_replicas) if self.max_replicas is not None else self.replicas

    @property
    def effective_max_replicas(self) -> int:
        return self.max_replicas if self.max_replicas is not None else self.replicas


class GcsFaultToleranceSpec(_Strict):
    """GCS fault tolerance through Redis, as KubeRay's ``gcsFaultToleranceOptions``: a restarted head reloads the
    cluster's state and workers rejoin it without restarting."""

    redis_address: str | None = Field(
        None,
        description="host:port of the Redis that stores GCS state; without it raypod runs one for the cluster "
        "(loopback only, password protected, persistent).",
    )
    external_storage_namespace: str | None = None

    @field_validator("redis_address")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^(redis(s)?://)?[A-Za-z0-9.\-]+:\d{1,5}$", value):
            raise ValueError(f"redis_address '{value}' must look like host:port")
        return value


class NodeRecovery(StrEnum):
    AUTOMATIC = "automatic"  # an unhealthy node is drained (if it answers), deleted and replaced
    MANUAL = "manual"  # an unhealthy node is reported (event, metric, status); operators replace it


MAX_HEALTH_CHECKS = 8
MAX_HEALTH_CHECK_COMMAND = 4096


class HealthCheckSpec(_Strict):
    """A user command run on each node's host every ``period_s``: exit 0 is healthy; a non-zero exit or a
    timeout is a failure, and ``failure_threshold`` failures in a row make the node unhealthy."""

    name: str = Field(description="DNS-1123 label, unique in the spec.")
    command: str = Field(min_length=1, max_length=MAX_HEALTH_CHECK_COMMAND, description="Run with /bin/sh -c.")
    period_s: float = Field(30.0, ge=1, le=3600)
    timeout_s: float = Field(10.0, gt=0, le=600)
    failure_threshold: int = Field(3, ge=1, le=100)

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        _check_dns_label(value, "health check name", max_len=40)
        return value

    @model_validator(mode="after")
    def _timeout_within_period(self) -> HealthCheckSpec:
        if self.timeout_s > self.period_s:
            raise ValueError(
                f"health check '{self.name}': timeout_s {self.timeout_s:g} is longer than period_s {self.period_s:g}"
            )
        return self


class RecoverySpec(_Strict):
    """Thresholds of the node health model and limits of automatic recovery (docs/resilience.md)."""

    probe_timeout_s: float = Field(2.0, gt=0, le=30, description="Timeout of the node agent's liveness probe.")
    probe_failure_threshold: int = Field(
        5, ge=1, le=100, description="Failed probes in a row (one per reconcile pass) that make a node unhealthy."
    )
    recovery_threshold: int = Field(
        2, ge=1, le=100, description="Good answers in a row a failing signal needs before it counts as healthy."
    )
    min_free_disk: ByteSize = Field(
        512 * 2**20, description="Free space below which the node's session/spill filesystem is a failure."
    )
    drain_timeout_s: float = Field(
        10.0, ge=0, le=3600, description="How long an unhealthy node that still answers is drained first."
    )
    max_replacements: int = Field(
        3, ge=1, le=1000, description="Replacements per group within window_s before the group is held."
    )
    window_s: float = Field(600.0, gt=0, le=7 * 86400)
    quarantine_s: float = Field(
        300.0, ge=0, le=86400, description="How long a replaced node's ports and session dir are not reused."
    )


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: Any) -> float:
    """Seconds from a number of seconds or a string such as ``90``, ``15m``, ``1.5h`` or ``500ms``.

    Raises:
        ValueError: anything else, or a negative number.
    """
    if isinstance(value, bool):
        raise ValueError(f"'{value}' is not a duration")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        found = _DURATION.match(str(value))
        if not found:
            raise ValueError(f"'{value}' is not a duration such as 90, 90s, 15m or 2h")
        seconds = float(found.group(1)) * _DURATION_UNITS[found.group(2) or "s"]
    if seconds < 0 or not math.isfinite(seconds):
        raise ValueError(f"'{value}' is not a duration: it must be a finite number >= 0")
    return seconds


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


class HangRuleSpec(_Strict):
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


class HangOverrides(_Strict):
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


class HangwatchSpec(_Strict):
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


class SpaceKind(StrEnum):
    JUPYTERLAB = "jupyterlab"
    CODE_EDITOR = "code-editor"


class SpaceSpec(_Strict):
    """A workspace: an IDE on a zero-compute Ray node of the cluster, so its kernels are drivers of the cluster."""

    name: str = Field(description="Workspace name (DNS-1123 label, unique in its namespace).")
    kind: SpaceKind = SpaceKind.JUPYTERLAB
    running: bool = Field(True, description="False: stopped; its node is gone, its files are kept.")
    owner: str | None = Field(None, max_length=128, description="Who may open it, besides team admins.")
    memory: ByteSize = Field(2**30, description="Memory Ray schedules against on the workspace's node.")
    python_env: str | None = Field(
        None,
        max_length=1024,
        description="A Python environment (its directory, e.g. a venv) whose interpreter runs the notebook kernels: "
        "the user's own packages, with ipykernel and the cluster's Ray version (JupyterLab only).",
    )

    @field_validator("name")
    @classmethod
    def _space_name(cls, value: str) -> str:
        _check_dns_label(value, "workspace name", max_len=40)
        return value

    @field_validator("python_env")
    @classmethod
    def _python_env(cls, value: str | None) -> str | None:
        if value is not None and (not value.startswith("/") or "\0" in value or "/../" in f"{value}/"):
            raise ValueError("an absolute path of a Python environment's directory, such as /opt/envs/ml")
        return value

    def node_name(self) -> str:
        return f"{SPACE_GROUP}-{self.name}"


class ClusterSpec(_Strict):
    """Everything needed to run one Ray cluster: the desired state the reconciler converges to."""

    name: str = Field(description="Cluster name (DNS-1123 label, at most 40 characters).")
    namespace: str = Field("default", description="Namespace (DNS-1123 label); a team owns namespaces.")
    owner: str | None = Field(None, max_length=128)
    ray_version: str = Field(DEFAULT_RAY_VERSION, pattern=r"^\d+\.\d+\.\d+$")
    image: str | None = Field(None, max_length=512, description="Container image on Kubernetes.")
    head: HeadGroupSpec = Field(default_factory=HeadGroupSpec)
    worker_groups: list[WorkerGroupSpec] = Field(default_factory=list, max_length=MAX_WORKER_GROUPS)
    env: dict[str, str] = Field(default_factory=dict, description="Environment variables of every node.")
    runtime_env: dict[str, Any] = Field(default_factory=dict, description="Default runtime_env of jobs.")
    gcs_fault_tolerance: GcsFaultToleranceSpec | None = None
    node_recovery: NodeRecovery = Field(NodeRecovery.AUTOMATIC, description="What raypod does with unhealthy nodes.")
    recovery: RecoverySpec = Field(default_factory=RecoverySpec)
    health_checks: list[HealthCheckSpec] = Field(default_factory=list, max_length=MAX_HEALTH_CHECKS)
    hangwatch: HangwatchSpec = Field(default_factory=HangwatchSpec)
    spaces: list[SpaceSpec] = Field(default_factory=list, max_length=MAX_SPACES, description="Workspaces.")
    priority: str = Field(
        "normal",
        max_length=63,
        pattern=DNS1123_LABEL.pattern,
        description="Priority class (low, normal, high unless configured): the queue's order and preemption.",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        _check_dns_label(value, "cluster name", max_len=40)
        return value

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        _check_dns_label(value, "namespace", max_len=63)
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        if len(value) > MAX_ENV_VARS:
            raise ValueError(f"at most {MAX_ENV_VARS} environment variables")
        for key, item in value.items():
            if len(key) > 256 or not ENV_NAME.match(key):
                raise ValueError(f"environment variable name '{key[:80]}' must match [A-Za-z_][A-Za-z0-9_]{{0,255}}")
            if key.startswith("RAYPOD_"):
                raise ValueError(f"environment variable '{key}' uses the reserved prefix RAYPOD_")
            if len(item.encode()) > MAX_ENV_VALUE_BYTES:
                # Linux refuses to start a process with one variable over 128 KiB (E2BIG).
                raise ValueError(f"environment variable '{key}' is over {MAX_ENV_VALUE_BYTES // 1024} KiB")
        if sum(len(k) + len(v.encode()) + 2 for k, v in value.items()) > MAX_ENV_BYTES:
            raise ValueError(f"environment variables are over {MAX_ENV_BYTES // 1024} KiB in all")
        return value

    @field_validator("runtime_env")
    @classmethod
    def _runtime_env(cls, value: dict[str, Any]) -> dict[str, Any]:
        return check_runtime_env(value)

    @model_validator(mode="after")
    def _unique_groups(self) -> ClusterSpec:
        names = [group.name for group in self.worker_groups]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"worker group names must be unique, repeated: {', '.join(duplicates)}")
        checks = [check.name for check in self.health_checks]
        repeated = sorted({name for name in checks if checks.count(name) > 1})
        if repeated:
            raise ValueError(f"health check names must be unique, repeated: {', '.join(repeated)}")
        spaces = [space.name for space in self.spaces]
        repeated = sorted({name for name in spaces if spaces.count(name) > 1})
        if repeated:
            raise ValueError(f"workspace names must be unique, repeated: {', '.join(repeated)}")
        return self

    def group_of(self, node: str) -> str:
        """The group a node name belongs to (``head`` is the head group's, ``space-*`` the workspaces')."""
        if node == "head":
            return HEAD_GROUP
        if node.startswith(SPACE_GROUP + "-"):
            return SPACE_GROUP
        return node.rsplit("-", 1)[0]

    def space(self, name: str) -> SpaceSpec | None:
        return next((space for space in self.spaces if space.name == name), None)

    def group(self, name: str) -> WorkerGroupSpec:
        """Return the worker group called ``name``.

        Raises:
            NotFound: no such group; the message lists the groups there are.
        """
        for group in self.worker_groups:
            if group.name == name:
                return group
        known = ", ".join(g.name for g in self.worker_groups) or "none"
        raise errors.NotFound(f"worker group '{name}' not in cluster '{self.name}' (groups: {known})")

    def with_replicas(self, group_name: str, replicas: int) -> ClusterSpec:
        """Return a copy with one group scaled; bounds are validated like any spec.

        Raises:
            NotFound: no such group.
            InvalidSpec: replicas outside the group's bounds.
        """
        self.group(group_name)
        data = self.model_dump(mode="json")
        for group in data["worker_groups"]:
            if group["name"] == group_name:
                group["replicas"] = replicas
        return parse_spec(data)

    def desired_nodes(self) -> list[NodeSpec]:
        """Return every node this spec asks for, head first, with deterministic names."""
        head_env = dict(self.env)
        managed_redis = False
        if self.gcs_fault_tolerance is not None:
            # The variables KubeRay sets on the head for gcsFaultToleranceOptions.
            if self.gcs_fault_tolerance.redis_address is not None:
                head_env["RAY_REDIS_ADDRESS"] = self.gcs_fault_tolerance.redis_address
            else:
                managed_redis = True  # the backend runs the Redis and sets the address
            head_env["RAY_external_storage_namespace"] = (
                self.gcs_fault_tolerance.external_storage_namespace or f"{self.namespace}-{self.name}"
            )
        head = NodeSpec.from_group(HEAD_GROUP, "head", self.head, head_env, is_head=True)
        nodes = [replace(head, managed_redis=True) if managed_redis else head]
        for group in self.worker_groups:
            nodes.extend(
                NodeSpec.from_group(group.name, node_name(group.name, index), group, self.env, is_head=False)
                for index in range(group.replicas)
            )
        if self.hangwatch.enabled:
            nodes = [replace(node, hangwatch=self.hangwatch) for node in nodes]
        for space in self.spaces:
            if space.running:
                # Zero compute: Ray schedules nothing here, so a notebook's tasks run on the workers.
                nodes.append(
                    NodeSpec(
                        name=space.node_name(),
                        group=SPACE_GROUP,
                        is_head=False,
                        cpus=0,
                        memory=space.memory,
                        object_store_memory=SPACE_OBJECT_STORE_BYTES,
                        labels={SPACE_LABEL: space.name},
                        env=dict(self.env),
                        space=space,
                        space_path=f"/spaces/{self.namespace}/{space.name}/",
                    )
                )
        return nodes

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json", exclude_none=True), sort_keys=False)


def node_name(group: str, index: int) -> str:
    """Name of the ``index``-th node of a worker group; scale-down removes the highest indices first."""
    return f"{group}-{index}"


HANGWATCH_SIDECAR = "hangwatch-agent"  # hang detection's agent (capabilities/hangwatch)
IDE_SIDECAR = "ide"  # a workspace's IDE (capabilities/spaces)


@dataclass(frozen=True)
class NodeSpec:
    """One node the backend must run: a group's resources resolved for a single node."""

    name: str
    group: str
    is_head: bool
    cpus: int
    memory: int
    object_store_memory: int
    gpus: int = 0
    resources: dict[str, float] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    managed_redis: bool = False  # a head whose GCS stores its state in a Redis the backend runs
    hangwatch: HangwatchSpec | None = None  # the hang detection agent's settings, when it runs on the node
    space: SpaceSpec | None = None  # the workspace whose IDE the node hosts
    space_path: str = ""  # the workspace's URL path on raypod's server (its IDE's base URL)
    # What the capabilities add to the node (files, environment, sidecars): attached by the planner when it creates
    # the node, translated by the backend.
    addons: addons_mod.NodeAddons = addons_mod.NONE

    def sidecars(self) -> tuple[str, ...]:
        """The processes a backend keeps beside this node (``ObservedNode.sidecars`` reports them by these names)."""
        return tuple(sidecar.name for sidecar in self.addons.sidecars)

    @classmethod
    def from_group(cls, group: str, name: str, spec: NodeGroupSpec, env: dict[str, str], *, is_head: bool) -> NodeSpec:
        return cls(
            name=name,
            group=group,
            is_head=is_head,
            cpus=spec.cpus,
            memory=spec.memory,
            object_store_memory=spec.object_store_memory,
            gpus=spec.gpus,
            resources=dict(spec.resources),
            labels=dict(spec.labels),
            env=dict(env),
        )


def _check_dns_label(value: str, what: str, *, max_len: int) -> None:
    if not value or len(value) > max_len or not DNS1123_LABEL.match(value):
        raise ValueError(
            f"{what} '{value}' must be 1-{max_len} characters of lowercase letters, digits and '-', "
            "starting and ending with a letter or digit"
        )


def parse_spec(data: Any) -> ClusterSpec:
    """Validate a spec from parsed JSON/YAML.

    Raises:
        InvalidSpec: with one line per problem, each naming the field.
    """
    try:
        return ClusterSpec.model_validate(data)
    except ValidationError as exc:
        raise errors.InvalidSpec(describe_validation_error(exc), detail=_problems(exc)) from None


def load_spec_data(text: str) -> dict[str, Any]:
    """Parse a YAML or JSON document into a mapping, unvalidated.

    Raises:
        InvalidSpec: the text is not a YAML/JSON mapping.
    """
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise errors.InvalidSpec(f"spec is not valid YAML or JSON: {exc}") from None
    if not isinstance(data, dict):
        raise errors.InvalidSpec("spec must be a mapping with at least a 'name'")
    return data


def load_spec(text: str) -> ClusterSpec:
    """Parse and validate a YAML or JSON spec.

    Raises:
        InvalidSpec: the text is not YAML/JSON, or the spec is invalid.
    """
    return parse_spec(load_spec_data(text))


def _problems(exc: ValidationError) -> list[dict[str, str]]:
    return [
        {"field": ".".join(str(part) for part in err["loc"]) or "(spec)", "problem": _clean(err["msg"])}
        for err in exc.errors()
    ]


def describe_validation_error(exc: ValidationError) -> str:
    """Turn a pydantic error into one readable line per problem ("field: problem")."""
    return "; ".join(f"{p['field']}: {p['problem']}" for p in _problems(exc))


def _clean(message: str) -> str:
    return message.removeprefix("Value error, ")


MAX_JOB_BACKOFF_S = 300.0


def check_runtime_env(value: dict[str, Any]) -> dict[str, Any]:
    """Raises ValueError: not JSON, or over MAX_RUNTIME_ENV_BYTES once encoded."""
    try:
        encoded = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"runtime_env must be JSON-serialisable: {exc}") from exc
    if len(encoded) > MAX_RUNTIME_ENV_BYTES:
        raise ValueError(f"runtime_env is over {MAX_RUNTIME_ENV_BYTES // 1024} KiB as JSON")
    return value


class JobSpec(BaseModel):
    """A raypod job: one Ray job submission, resubmitted after a FAILED attempt like KubeRay's ``backoffLimit``."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    entrypoint: str = Field(min_length=1, max_length=16384)
    runtime_env: dict[str, Any] = Field(default_factory=dict)
    metadata: dict[str, str] = Field(default_factory=dict)
    max_retries: int = Field(0, ge=0, le=20, description="Resubmissions after a FAILED attempt (backoffLimit).")
    backoff_s: float = Field(2.0, ge=0, le=MAX_JOB_BACKOFF_S, description="First retry delay; doubles each time.")
    as_rayjob: bool = Field(
        False,
        description="Kubernetes backend: run as a KubeRay RayJob on a cluster of its own shaped as the named one "
        "(backoffLimit = max_retries); KubeRay retries it.",
    )
    keep_cluster: bool = Field(
        False, description="With as_rayjob: keep the RayJob's cluster after the job ends (shutdownAfterJobFinishes)."
    )

    @model_validator(mode="after")
    def _rayjob_options(self) -> JobSpec:
        if self.keep_cluster and not self.as_rayjob:
            raise ValueError("keep_cluster: only a job run as a RayJob (as_rayjob) has a cluster of its own")
        return self

    @field_validator("runtime_env")
    @classmethod
    def _runtime_env(cls, value: dict[str, Any]) -> dict[str, Any]:
        return check_runtime_env(value)

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, value: dict[str, str]) -> dict[str, str]:
        def too_long(key: str, item: str) -> bool:
            return len(item) > (MAX_HANG_RULES_METADATA if key == "raypod.hang_rules" else 1024)

        if len(value) > 64 or any(len(k) > 128 or too_long(k, v) for k, v in value.items()):
            raise ValueError("metadata: at most 64 entries, keys up to 128 and values up to 1024 characters")
        hang_overrides_from_metadata(value)
        return value


# -- serving -------------------------------------------------------------------------------------------------

MAX_SERVE_REPLICAS = 64
DEFAULT_RESERVE_TOKENS = 8192


class ServeDeploySpec(_Strict):
    """A catalog model on a cluster's Ray Serve, behind the OpenAI-compatible API."""

    model: str = Field(min_length=1, max_length=129, description="A catalog model id (`raypod model list`).")
    name: str | None = Field(None, description="The application's name and route; default: from the model id.")
    replicas: int = Field(1, ge=1, le=MAX_SERVE_REPLICAS)
    autoscale: tuple[int, int] | None = Field(None, description="(min, max) replicas; replaces `replicas`.")
    cpus: float = Field(1.0, ge=0, le=MAX_CPUS_PER_NODE, description="Logical CPUs per replica.")
    engine: str = Field("auto", pattern="^(auto|cpu|vllm)$", description="vLLM where the cluster has GPUs.")
    kv_cache: bool = True
    l1_bytes: ByteSize | None = Field(None, description="Per-node L1 pool; default: half the object store.")
    l2: str | None = Field(
        None,
        max_length=2048,
        description="Shared tier: a redis:// or fsspec URL, 'none', or unset for a Redis raypod runs.",
    )
    l2_bytes: ByteSize = Field(2 * 2**30, description="Memory of the Redis raypod runs for L2.")
    chunk_tokens: int = Field(256, ge=16, le=8192)
    reserve_tokens: int | None = Field(
        None,
        ge=0,
        le=1_048_576,
        description=(
            "Tokens of keys and values each replica of the CPU engine allocates when it starts (its working pool, "
            "and its L2 read buffer): the first long prompt then finds them ready. Default: the model's context, "
            "up to 8192; 0: grow on demand."
        ),
    )

    def reserved_tokens(self, max_context: int) -> int:
        """What a replica reserves: never more than the model's context."""
        return min(max_context, DEFAULT_RESERVE_TOKENS if self.reserve_tokens is None else self.reserve_tokens)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None:
            _check_dns_label(value, "deployment name", max_len=40)
        return value

    @field_validator("autoscale")
    @classmethod
    def _autoscale(cls, value: tuple[int, int] | None) -> tuple[int, int] | None:
        if value is not None and not (0 <= value[0] <= value[1] <= MAX_SERVE_REPLICAS and value[1] >= 1):
            raise ValueError(f"autoscale is MIN:MAX with 0 <= MIN <= MAX <= {MAX_SERVE_REPLICAS} and MAX >= 1")
        return value

    def app_name(self) -> str:
        if self.name:
            return self.name
        cleaned = re.sub(r"[^a-z0-9-]+", "-", self.model.lower().split("/")[-1]).strip("-")[:40].strip("-")
        return cleaned or "model"


def parse_autoscale(value: str) -> tuple[int, int]:
    """``MIN:MAX``. Raises ValueError."""
    low, sep, high = value.partition(":")
    if not sep or not low.strip().isdigit() or not high.strip().isdigit():
        raise ValueError(f"autoscale must be MIN:MAX (e.g. 1:4), not {value!r}")
    return int(low), int(high)


class QuotaPolicy(StrEnum):
    QUEUE = "queue"  # work beyond the quota waits in the queue
    REJECT = "reject"  # work beyond the quota is refused


class QuotaSpec(BaseModel):
    """A team's limits on what its clusters may hold together; an absent limit is no limit."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    cpus: float | None = Field(None, ge=0, le=1_000_000, description="Ray CPUs of all nodes together.")
    memory: ByteSize | None = Field(None, description="Ray memory plus object store of all nodes together.")
    gpus: int | None = Field(None, ge=0, le=100_000)
    clusters: int | None = Field(None, ge=0, le=100_000)
    nodes: int | None = Field(None, ge=0, le=1_000_000)
    policy: QuotaPolicy = QuotaPolicy.QUEUE
    borrow: bool = Field(False, description="May use quota other teams leave idle (given back on demand).")
