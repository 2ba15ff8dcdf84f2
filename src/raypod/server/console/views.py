"""Console-only read views: the rows and labels pages show, computed from API models. Pure."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from raypod import spec as spec_mod
from raypod import state


def age(since: datetime, now: datetime) -> str:
    """``45s``, ``12m``, ``5h``, ``3d``: how long ago, as kubectl prints it."""
    seconds = max(0, int((now - since).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


@dataclass(frozen=True)
class ClusterRow:
    name: str
    namespace: str
    owner: str
    phase: str
    alive: int
    desired: int
    age: str
    created: str
    deleting: bool

    @classmethod
    def of(cls, view: state.ClusterView, now: datetime) -> ClusterRow:
        return cls(
            name=view.spec.name,
            namespace=view.spec.namespace,
            owner=view.spec.owner or "",
            phase="Deleting" if view.deleting else view.status.phase.value,
            alive=view.status.ready_nodes,
            desired=view.status.desired_nodes or len(view.spec.desired_nodes()),
            age=age(view.created_at, now),
            created=view.created_at.isoformat(timespec="seconds"),
            deleting=view.deleting,
        )


@dataclass(frozen=True)
class NodeRow:
    name: str
    group: str
    phase: str
    is_head: bool
    cpus: int
    gpus: int
    memory: str
    object_store: str
    pid: int | None
    ray_node_id: str
    reason: str
    health: str = "Unknown"
    health_reasons: tuple[str, ...] = ()
    cordoned: bool = False


def node_rows(view: state.ClusterView) -> list[NodeRow]:
    """Observed nodes with the resources their group asks for; desired nodes not seen yet show as Pending."""
    seen = {node.name: node for node in view.status.nodes}
    rows = []
    for desired in view.spec.desired_nodes():
        node = seen.pop(desired.name, None)
        rows.append(
            NodeRow(
                name=desired.name,
                group=desired.group,
                phase=node.phase.value if node else "Pending",
                is_head=desired.is_head,
                cpus=desired.cpus,
                gpus=desired.gpus,
                memory=spec_mod.format_bytes(desired.memory),
                object_store=spec_mod.format_bytes(desired.object_store_memory),
                pid=node.pid if node else None,
                ray_node_id=(node.ray_node_id or "")[:12] if node else "",
                reason=node.reason if node else "",
                health=node.health.value if node else "Unknown",
                health_reasons=tuple(node.health_reasons) if node else (),
                cordoned=node.cordoned if node else False,
            )
        )
    for node in seen.values():  # nodes being removed by a scale-down
        rows.append(
            NodeRow(
                name=node.name,
                group=node.group,
                phase=node.phase.value,
                is_head=node.is_head,
                cpus=0,
                gpus=0,
                memory="",
                object_store="",
                pid=node.pid,
                ray_node_id=(node.ray_node_id or "")[:12],
                reason=node.reason or "being removed",
                health=node.health.value,
                health_reasons=tuple(node.health_reasons),
            )
        )
    return rows


def address(view: state.ClusterView) -> str:
    """The ``raypod://`` address of a cluster; the namespace is left out when it is the default one."""
    if view.spec.namespace == "default":
        return f"raypod://{view.spec.name}"
    return f"raypod://{view.spec.name}/{view.spec.namespace}"


def snippets(view: state.ClusterView) -> dict[str, str]:
    """Copyable ways to use a cluster from a terminal or from Python."""
    target = address(view)
    name, namespace = view.spec.name, view.spec.namespace
    return {
        "ray job submit": f"ray job submit --address {target} --working-dir . -- python my_script.py",
        "JobSubmissionClient": (
            "from ray.job_submission import JobSubmissionClient\n\n"
            f'client = JobSubmissionClient("{target}")\n'
            'job_id = client.submit_job(entrypoint="python my_script.py", runtime_env={"working_dir": "."})'
        ),
        "raypod SDK": (
            "import raypod\n\n"
            "with raypod.Client() as client:\n"
            f'    cluster = client.clusters.get("{name}", namespace="{namespace}")\n'
            "    print(cluster.status.phase)"
        ),
    }


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True) if value else ""


QUOTA_RESOURCES = ("cpus", "memory", "gpus", "clusters", "nodes")


@dataclass(frozen=True)
class QuotaRow:
    team: str
    namespace: str | None  # a namespace's own cap inside its team's quota
    cells: dict[str, str]  # resource -> "used / limit" ("used / -" where unlimited)
    over: frozenset[str]  # resources where usage exceeds the quota (it was lowered below usage)
    borrowed: str
    policy: str
    borrow: bool
    queued: int
    quota: dict[str, Any]  # the quota as the set form edits it

    @property
    def key(self) -> str:
        return self.team if self.namespace is None else f"ns-{self.namespace}"

    @classmethod
    def of(cls, view: state.QuotaView) -> QuotaRow:
        cells, over = {}, set()
        for resource in QUOTA_RESOURCES:
            limit = getattr(view.quota, resource)
            used = view.usage.get(resource, 0.0)
            cells[resource] = f"{_amount(resource, used)} / {'-' if limit is None else _amount(resource, limit)}"
            if limit is not None and used > limit:
                over.add(resource)
        borrowed = ", ".join(f"{name} {_amount(name, value)}" for name, value in view.borrowed.items() if value)
        return cls(
            team=view.team,
            namespace=view.namespace,
            cells=cells,
            over=frozenset(over),
            borrowed=borrowed,
            policy=view.quota.policy.value,
            borrow=view.quota.borrow,
            queued=view.queued,
            quota=view.quota.model_dump(mode="json"),
        )


def _amount(resource: str, value: float) -> str:
    if resource == "memory":
        return spec_mod.format_bytes(int(value))
    return f"{value:g}"
