"""The values every spec shares: limits, names, sizes and durations, and readable validation errors."""

from __future__ import annotations

import json
import math
import re
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    PlainSerializer,
    ValidationError,
)

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


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


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


def is_dns_label(value: str, max_len: int = 63) -> bool:
    """A DNS-1123 label: what every raypod name (namespace, cluster, node, workspace) is."""
    return 0 < len(value) <= max_len and DNS1123_LABEL.match(value) is not None


def check_dns_label(value: str, what: str, *, max_len: int) -> None:
    if not is_dns_label(value, max_len):
        raise ValueError(
            f"{what} '{value}' must be 1-{max_len} characters of lowercase letters, digits and '-', "
            "starting and ending with a letter or digit"
        )


def _dns_label(what: str, max_len: int) -> AfterValidator:
    def check(value: str) -> str:
        check_dns_label(value, what, max_len=max_len)
        return value

    return AfterValidator(check)


# Names that become Kubernetes object names or label values (a node's name is "<cluster>-<group>-<index>").
ClusterName = Annotated[str, _dns_label("cluster name", 40)]
Namespace = Annotated[str, _dns_label("namespace", 63)]
WorkspaceName = Annotated[str, _dns_label("workspace name", 40)]
HealthCheckName = Annotated[str, _dns_label("health check name", 40)]
DeploymentName = Annotated[str, _dns_label("deployment name", 40)]
ScheduleName = Annotated[str, _dns_label("name", 63)]


def problems(exc: ValidationError) -> list[dict[str, str]]:
    return [
        {"field": ".".join(str(part) for part in err["loc"]) or "(spec)", "problem": clean_message(err["msg"])}
        for err in exc.errors()
    ]


def describe_validation_error(exc: ValidationError) -> str:
    """Turn a pydantic error into one readable line per problem ("field: problem")."""
    return "; ".join(f"{p['field']}: {p['problem']}" for p in problems(exc))


def clean_message(message: str) -> str:
    return message.removeprefix("Value error, ")


def check_runtime_env(value: dict[str, Any]) -> dict[str, Any]:
    """Raises ValueError: not JSON, or over MAX_RUNTIME_ENV_BYTES once encoded."""
    try:
        encoded = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"runtime_env must be JSON-serialisable: {exc}") from exc
    if len(encoded) > MAX_RUNTIME_ENV_BYTES:
        raise ValueError(f"runtime_env is over {MAX_RUNTIME_ENV_BYTES // 1024} KiB as JSON")
    return value
