"""Desired state: what a user asks for. Pure data and validation, no I/O.

A ``ClusterSpec`` describes one Ray cluster independently of where it runs: the local backend turns it into
``ray start`` processes, the KubeRay manifests turn it into a ``ray.io/v1`` ``RayCluster``. The package's modules
hold what a cluster spec is made of and the other specs (``jobs``, ``serving``, ``quotas``); every name is
reachable as ``raypod.spec.<Name>``.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import yaml
from pydantic import (
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from raypod import errors
from raypod.spec.autoscaling import AutoscalingSpec, Upscaling
from raypod.spec.hangwatch import (
    HANG_METADATA,
    HANG_RULE_FIELDS,
    MAX_HANG_RULES,
    MAX_HANG_RULES_METADATA,
    MAX_RULE_PATTERN,
    Duration,
    HangAction,
    HangOverrides,
    HangRuleSpec,
    HangwatchSpec,
    Timeout,
    hang_overrides_from_metadata,
    load_hang_rules,
    parse_hang_overrides,
)
from raypod.spec.jobs import (
    JOB_ID_PATTERN,
    MAX_JOB_BACKOFF_S,
    SUBMITTED_BY,
    JobSpec,
)
from raypod.spec.nodes import (
    HANGWATCH_SIDECAR,
    IDE_SIDECAR,
    NodeSpec,
    node_name,
)
from raypod.spec.quotas import (
    QuotaPolicy,
    QuotaSpec,
)
from raypod.spec.recovery import (
    MAX_HEALTH_CHECK_COMMAND,
    MAX_HEALTH_CHECKS,
    HealthCheckSpec,
    NodeRecovery,
    RecoverySpec,
)
from raypod.spec.schedules import ConcurrencyPolicy, ScheduleSpec
from raypod.spec.serving import (
    DEFAULT_RESERVE_TOKENS,
    MAX_SERVE_REPLICAS,
    ServeDeploySpec,
    parse_autoscale,
)
from raypod.spec.spaces import (
    SpaceKind,
    SpaceSpec,
)
from raypod.spec.values import (
    DEFAULT_RAY_VERSION,
    DNS1123_LABEL,
    ENV_NAME,
    HEAD_GROUP,
    LABEL_KEY,
    LABEL_VALUE,
    MAX_CPUS_PER_NODE,
    MAX_ENV_BYTES,
    MAX_ENV_VALUE_BYTES,
    MAX_ENV_VARS,
    MAX_GPUS_PER_NODE,
    MAX_REPLICAS,
    MAX_RUNTIME_ENV_BYTES,
    MAX_SPACES,
    MAX_WORKER_GROUPS,
    RAY_BUILTIN_RESOURCES,
    RESERVED_LABEL_PREFIXES,
    RESOURCE_NAME,
    SPACE_GROUP,
    SPACE_LABEL,
    SPACE_OBJECT_STORE_BYTES,
    ByteSize,
    ClusterName,
    Namespace,
    Strict,
    check_dns_label,
    check_runtime_env,
    clean_message,
    describe_validation_error,
    format_bytes,
    is_dns_label,
    parse_bytes,
    parse_duration,
    problems,
)


class NodeGroupSpec(Strict):
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
        check_dns_label(value, "worker group name", max_len=40)
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


class GcsFaultToleranceSpec(Strict):
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


class ClusterSpec(Strict):
    """Everything needed to run one Ray cluster: the desired state the reconciler converges to."""

    name: ClusterName = Field(description="Cluster name (DNS-1123 label, at most 40 characters).")
    namespace: Namespace = Field("default", description="Namespace (DNS-1123 label); a team owns namespaces.")
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
    autoscaling: AutoscalingSpec | None = Field(
        None, description="Scale the groups whose min_replicas < max_replicas from Ray's demand (KubeRay's autoscaler)."
    )
    suspend_after_idle_s: int | None = Field(
        None,
        ge=1,
        le=30 * 24 * 3600,
        description="Suspend the cluster (stop every node, give its quota back) after this long with nothing running.",
    )
    priority: str = Field(
        "normal",
        max_length=63,
        pattern=DNS1123_LABEL.pattern,
        description="Priority class (low, normal, high unless configured): the queue's order and preemption.",
    )

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
        if self.autoscaling is not None and not any(
            g.effective_min_replicas < g.effective_max_replicas for g in self.worker_groups
        ):
            raise ValueError("autoscaling: no worker group may grow or shrink (give one min_replicas < max_replicas)")
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
        nodes += [self.space_node(space) for space in self.spaces if space.running]
        return nodes

    def space_node(self, space: SpaceSpec) -> NodeSpec:
        """A workspace's node. Zero compute: Ray schedules nothing there, so a notebook's tasks run on the workers."""
        return NodeSpec(
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

    def group_nodes(self) -> dict[str, NodeSpec]:
        """One node of each group as it would be made, by group (a workspace's node by its own name), whatever the
        replicas and whether a workspace runs: what a backend that renders groups (KubeRay's pod templates) asks
        the capabilities' add-ons for."""
        whole = self.model_copy(
            update={
                "worker_groups": [g.model_copy(update={"replicas": 1}) for g in self.worker_groups],
                "spaces": [],
            }
        )
        found: dict[str, NodeSpec] = {}
        for node in whole.desired_nodes():
            found.setdefault(node.group, node)
        for space in self.spaces:
            found[space.node_name()] = self.space_node(space)
        return found

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json", exclude_none=True), sort_keys=False)


def parse_spec(data: Any) -> ClusterSpec:
    """Validate a spec from parsed JSON/YAML.

    Raises:
        InvalidSpec: with one line per problem, each naming the field.
    """
    try:
        return ClusterSpec.model_validate(data)
    except ValidationError as exc:
        raise errors.InvalidSpec(describe_validation_error(exc), detail=problems(exc)) from None


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


__all__ = [
    "DEFAULT_RAY_VERSION",
    "DEFAULT_RESERVE_TOKENS",
    "DNS1123_LABEL",
    "ENV_NAME",
    "HANGWATCH_SIDECAR",
    "HANG_METADATA",
    "HANG_RULE_FIELDS",
    "HEAD_GROUP",
    "IDE_SIDECAR",
    "JOB_ID_PATTERN",
    "LABEL_KEY",
    "LABEL_VALUE",
    "MAX_CPUS_PER_NODE",
    "MAX_ENV_BYTES",
    "MAX_ENV_VALUE_BYTES",
    "MAX_ENV_VARS",
    "MAX_GPUS_PER_NODE",
    "MAX_HANG_RULES",
    "MAX_HANG_RULES_METADATA",
    "MAX_HEALTH_CHECKS",
    "MAX_HEALTH_CHECK_COMMAND",
    "MAX_JOB_BACKOFF_S",
    "MAX_REPLICAS",
    "MAX_RULE_PATTERN",
    "MAX_RUNTIME_ENV_BYTES",
    "MAX_SERVE_REPLICAS",
    "MAX_SPACES",
    "MAX_WORKER_GROUPS",
    "RAY_BUILTIN_RESOURCES",
    "RESERVED_LABEL_PREFIXES",
    "RESOURCE_NAME",
    "SPACE_GROUP",
    "SPACE_LABEL",
    "SPACE_OBJECT_STORE_BYTES",
    "SUBMITTED_BY",
    "AutoscalingSpec",
    "ByteSize",
    "ClusterSpec",
    "ConcurrencyPolicy",
    "Duration",
    "GcsFaultToleranceSpec",
    "HangAction",
    "HangOverrides",
    "HangRuleSpec",
    "HangwatchSpec",
    "HeadGroupSpec",
    "HealthCheckSpec",
    "JobSpec",
    "NodeGroupSpec",
    "NodeRecovery",
    "NodeSpec",
    "QuotaPolicy",
    "QuotaSpec",
    "RecoverySpec",
    "ScheduleSpec",
    "ServeDeploySpec",
    "SpaceKind",
    "SpaceSpec",
    "Strict",
    "Timeout",
    "Upscaling",
    "WorkerGroupSpec",
    "check_dns_label",
    "check_runtime_env",
    "clean_message",
    "describe_validation_error",
    "format_bytes",
    "hang_overrides_from_metadata",
    "is_dns_label",
    "load_hang_rules",
    "load_spec",
    "load_spec_data",
    "node_name",
    "parse_autoscale",
    "parse_bytes",
    "parse_duration",
    "parse_hang_overrides",
    "parse_spec",
    "problems",
]
