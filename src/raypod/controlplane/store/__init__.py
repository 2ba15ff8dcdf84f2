"""Persisted specs, status and events, through SQLAlchemy (SQLite in WAL mode by default; any URL works).

The schema is owned by the Alembic migrations beside this file and upgraded when a store opens.
"""

from __future__ import annotations

import builtins
import functools
import json
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy import event as sa_event

from raypod import errors, state
from raypod import spec as spec_mod
from raypod.controlplane.store.schema import clusters, events, hang_detections, namespace_quotas, node_requests, quotas

MIGRATIONS = Path(__file__).parents[1] / "migrations"


@dataclass(frozen=True)
class NodeRequest:
    node: str
    kind: str  # REPLACE, CORDON or DELETE_FILES
    incarnation: str | None
    requested_by: str
    path: str | None = None  # DELETE_FILES: the directory


REPLACE = "replace"
CORDON = "cordon"
# Delete a directory the node was given (a workspace's files) once the node is gone: the loop does it, never a
# request, so that no pass can give the directory back to a node it has not removed yet.
DELETE_FILES = "delete-files"


@dataclass(frozen=True)
class EventFilter:
    """Which events to read: ``namespaces=None`` means all of them; ``text`` matches reason, message or node."""

    namespaces: frozenset[str] | None = None
    cluster: str | None = None
    type: state.EventType | None = None
    text: str | None = None


def now() -> datetime:
    return datetime.now(UTC)


class Store:
    """Clusters and their events. Safe to use from the API threads and the reconcile loop at once."""

    def __init__(self, url: str) -> None:
        if url.startswith("sqlite:///"):
            Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        self.engine = sa.create_engine(url, connect_args={"timeout": 30} if url.startswith("sqlite") else {})
        if url.startswith("sqlite"):
            sa_event.listen(self.engine, "connect", _sqlite_pragmas)
        self._migrate()

    def _migrate(self) -> None:
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        with self.engine.begin() as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, "head")

    def close(self) -> None:
        self.engine.dispose()

    # -- clusters ------------------------------------------------------------------------------------------

    def insert(self, spec: spec_mod.ClusterSpec, *, queued: bool = False, reason: str = "") -> state.ClusterView:
        """Raises AlreadyExists when the namespace already has a cluster of that name. ``queued``: it waits in the
        governance queue (``reason``: why; or, admitted, a note such as borrowed)."""
        created = now()
        row = {
            "uid": uuid.uuid4().hex[:16],
            "namespace": spec.namespace,
            "name": spec.name,
            "spec": spec.model_dump_json(),
            "generation": 1,
            "status": state.ClusterStatus(desired_nodes=len(spec.desired_nodes())).model_dump_json(),
            "deleting": False,
            "created_at": created,
            "updated_at": created,
            "queued": queued,
            "queue_reason": reason,
        }
        try:
            with self.engine.begin() as connection:
                connection.execute(clusters.insert().values(**row))
        except sa.exc.IntegrityError:
            raise errors.AlreadyExists(
                f"cluster '{spec.name}' already exists in namespace '{spec.namespace}'; "
                "pick another name or delete it first"
            ) from None
        return self.get(spec.namespace, spec.name)

    def get(self, namespace: str, name: str, *, list_known: bool = True) -> state.ClusterView:
        """Raises NotFound, naming the clusters the namespace does have (unless ``list_known`` is false: for
        callers whose right to see them is not established)."""
        with self.engine.connect() as connection:
            row = connection.execute(
                clusters.select().where(clusters.c.namespace == namespace, clusters.c.name == name)
            ).first()
            if row is None and not list_known:
                raise errors.NotFound(f"cluster '{name}' not found in namespace '{namespace}'")
            if row is None:
                names = (
                    connection.execute(
                        sa.select(clusters.c.name).where(clusters.c.namespace == namespace).order_by(clusters.c.name)
                    )
                    .scalars()
                    .all()
                )
        if row is None:
            known = ", ".join(names) if names else "none"
            raise errors.NotFound(f"cluster '{name}' not found in namespace '{namespace}' (clusters there: {known})")
        return _view(row)

    def by_uid(self, uid: str) -> state.ClusterView | None:
        with self.engine.connect() as connection:
            row = connection.execute(clusters.select().where(clusters.c.uid == uid)).first()
        return None if row is None else _view(row)

    def list(
        self,
        namespace: str | None = None,
        *,
        namespaces: Collection[str] | None = None,
        after: tuple[str, str] | None = None,
        limit: int | None = None,
    ) -> list[state.ClusterView]:
        """Clusters by namespace and name; ``namespaces`` restricts to those, ``after``/``limit`` give one page."""
        query = clusters.select().order_by(clusters.c.namespace, clusters.c.name)
        if namespace is not None:
            query = query.where(clusters.c.namespace == namespace)
        if namespaces is not None:
            query = query.where(clusters.c.namespace.in_(sorted(namespaces)))
        if after is not None:
            query = query.where(sa.tuple_(clusters.c.namespace, clusters.c.name) > sa.tuple_(*after))
        if limit is not None:
            query = query.limit(limit)
        with self.engine.connect() as connection:
            return [_view(row) for row in connection.execute(query)]

    def specs(self, *, excluding: str | None = None) -> builtins.list[spec_mod.ClusterSpec]:
        """Every cluster's spec (not its status: cheaper, for capacity checks)."""
        query = sa.select(clusters.c.spec)
        if excluding is not None:
            query = query.where(clusters.c.uid != excluding)
        with self.engine.connect() as connection:
            return [_spec(row[0]) for row in connection.execute(query)]

    def update_spec(self, uid: str, spec: spec_mod.ClusterSpec) -> None:
        with self.engine.begin() as connection:
            connection.execute(
                clusters.update()
                .where(clusters.c.uid == uid)
                .values(spec=spec.model_dump_json(), generation=clusters.c.generation + 1, updated_at=now())
            )

    def set_pending(self, uid: str, spec: spec_mod.ClusterSpec | None, reason: str = "") -> None:
        """Queue a scale-up (``spec``, why it waits) or drop the one waiting (None)."""
        values: dict[str, Any] = {
            "pending_spec": spec.model_dump_json() if spec is not None else None,
            "pending_reason": reason,
            "pending_since": now() if spec is not None else None,
            "updated_at": now(),
        }
        with self.engine.begin() as connection:
            connection.execute(clusters.update().where(clusters.c.uid == uid).values(**values))

    def set_pending_reason(self, uid: str, reason: str) -> None:
        with self.engine.begin() as connection:
            connection.execute(clusters.update().where(clusters.c.uid == uid).values(pending_reason=reason))

    def admit_pending(self, uid: str, spec: spec_mod.ClusterSpec) -> None:
        """The waiting scale-up becomes the cluster's spec."""
        with self.engine.begin() as connection:
            connection.execute(
                clusters.update()
                .where(clusters.c.uid == uid)
                .values(
                    spec=spec.model_dump_json(),
                    generation=clusters.c.generation + 1,
                    pending_spec=None,
                    pending_reason="",
                    pending_since=None,
                    updated_at=now(),
                )
            )

    def set_queued(self, uid: str, queued: bool, reason: str = "", preempted_until: datetime | None = None) -> None:
        """Queue the cluster (``reason``: why it waits; ``preempted_until``: a preempted cluster's grace, kept while
        it waits when not given) or admit it (``reason``: a note, such as borrowed; the grace ends)."""
        values: dict[str, Any] = {"queued": queued, "queue_reason": reason, "updated_at": now()}
        if preempted_until is not None or not queued:
            values["preempted_until"] = preempted_until
        with self.engine.begin() as connection:
            connection.execute(clusters.update().where(clusters.c.uid == uid).values(**values))

    # -- quotas ------------------------------------------------------------------------------------------

    def quotas(self) -> dict[str, spec_mod.QuotaSpec]:
        """Teams' quotas, by team."""
        return self._quotas(quotas)

    def namespace_quotas(self) -> dict[str, spec_mod.QuotaSpec]:
        """Namespaces' own quotas, by namespace."""
        return self._quotas(namespace_quotas)

    def set_quota(self, team: str, quota: spec_mod.QuotaSpec | None, by: str) -> None:
        self._set_quota(quotas, team, quota, by)

    def set_namespace_quota(self, namespace: str, quota: spec_mod.QuotaSpec | None, by: str) -> None:
        self._set_quota(namespace_quotas, namespace, quota, by)

    def _quotas(self, table: sa.Table) -> dict[str, spec_mod.QuotaSpec]:
        key = table.primary_key.columns[0]
        with self.engine.connect() as connection:
            rows = connection.execute(sa.select(key, table.c.spec)).all()
        return {row[0]: spec_mod.QuotaSpec.model_validate_json(row[1]) for row in rows}

    def _set_quota(self, table: sa.Table, owner: str, quota: spec_mod.QuotaSpec | None, by: str) -> None:
        key = table.primary_key.columns[0]
        with self.engine.begin() as connection:
            connection.execute(table.delete().where(key == owner))
            if quota is not None:
                values = {key.name: owner, "spec": quota.model_dump_json(), "updated_by": by, "updated_at": now()}
                connection.execute(table.insert().values(**values))

    def mark_deleting(self, uid: str) -> None:
        with self.engine.begin() as connection:
            connection.execute(clusters.update().where(clusters.c.uid == uid).values(deleting=True, updated_at=now()))

    def set_suspended(self, uid: str, suspended: bool) -> None:
        """Suspend the cluster (its nodes stop, its quota is given back) or resume it."""
        with self.engine.begin() as connection:
            connection.execute(
                clusters.update()
                .where(clusters.c.uid == uid)
                .values(suspended_at=now() if suspended else None, updated_at=now())
            )

    def any_queued(self) -> bool:
        with self.engine.connect() as connection:
            return connection.execute(sa.select(clusters.c.uid).where(clusters.c.queued).limit(1)).first() is not None

    def fingerprint(self) -> tuple[object, ...]:
        """Changes whenever a cluster is added, removed, changes spec, is marked for deletion, queued or admitted
        (not when only its status changes): a cheap test for "anything new to decide?"."""
        with self.engine.connect() as connection:
            row = connection.execute(sa.select(sa.func.count(), sa.func.max(clusters.c.updated_at))).one()
        return tuple(row)

    def save_status(self, uid: str, status: state.ClusterStatus) -> None:
        with self.engine.begin() as connection:
            connection.execute(clusters.update().where(clusters.c.uid == uid).values(status=status.model_dump_json()))

    def remove(self, uid: str) -> None:
        with self.engine.begin() as connection:
            connection.execute(clusters.delete().where(clusters.c.uid == uid))
            connection.execute(node_requests.delete().where(node_requests.c.cluster_uid == uid))
            connection.execute(hang_detections.delete().where(hang_detections.c.cluster_uid == uid))

    # -- events --------------------------------------------------------------------------------------------

    def add_event(self, uid: str, recorded: state.Event) -> None:
        with self.engine.begin() as connection:
            connection.execute(events.insert().values(cluster_uid=uid, **recorded.model_dump()))

    def record(
        self, view: state.ClusterView, kind: state.EventType, reason: str, message: str, node: str | None = None
    ) -> None:
        """Record an event of a cluster, now."""
        self.add_event(
            view.uid,
            state.Event(
                time=now(),
                namespace=view.spec.namespace,
                cluster=view.spec.name,
                type=kind,
                reason=reason,
                message=message,
                node=node,
            ),
        )

    def latest_node_reasons(self, uid: str, reasons: frozenset[str]) -> dict[str, str]:
        """For each node of a cluster, the reason of its newest event among ``reasons``."""
        newest = (
            sa.select(sa.func.max(events.c.id))
            .where(events.c.cluster_uid == uid, events.c.node.is_not(None), events.c.reason.in_(sorted(reasons)))
            .group_by(events.c.node)
        )
        with self.engine.connect() as connection:
            rows = connection.execute(sa.select(events.c.node, events.c.reason).where(events.c.id.in_(newest)))
            return {row.node: row.reason for row in rows}

    def count_node_events(self, uid: str, reasons: frozenset[str], since: datetime) -> dict[str, int]:
        """How many events among ``reasons`` each node of a cluster had since ``since``."""
        query = (
            sa.select(events.c.node, sa.func.count())
            .where(
                events.c.cluster_uid == uid,
                events.c.node.is_not(None),
                events.c.reason.in_(sorted(reasons)),
                events.c.time >= since,
            )
            .group_by(events.c.node)
        )
        with self.engine.connect() as connection:
            return {row[0]: int(row[1]) for row in connection.execute(query)}

    # -- operators' requests on nodes ----------------------------------------------------------------------

    def request_node(self, uid: str, node: str, kind: str, requested_by: str, path: str | None = None) -> None:
        """Record (or renew) a request; a repeated replace request starts over for the node's next incarnation."""
        with self.engine.begin() as connection:
            connection.execute(
                node_requests.delete().where(
                    node_requests.c.cluster_uid == uid, node_requests.c.node == node, node_requests.c.kind == kind
                )
            )
            connection.execute(
                node_requests.insert().values(
                    cluster_uid=uid,
                    node=node,
                    kind=kind,
                    incarnation=None,
                    requested_by=requested_by,
                    created_at=now(),
                    path=path,
                )
            )

    def clear_node_request(self, uid: str, node: str, kind: str) -> bool:
        """Whether there was such a request."""
        with self.engine.begin() as connection:
            result = connection.execute(
                node_requests.delete().where(
                    node_requests.c.cluster_uid == uid, node_requests.c.node == node, node_requests.c.kind == kind
                )
            )
        return bool(result.rowcount)

    def bind_node_request(self, uid: str, node: str, kind: str, incarnation: str) -> None:
        with self.engine.begin() as connection:
            connection.execute(
                node_requests.update()
                .where(
                    node_requests.c.cluster_uid == uid,
                    node_requests.c.node == node,
                    node_requests.c.kind == kind,
                    node_requests.c.incarnation.is_(None),
                )
                .values(incarnation=incarnation)
            )

    def node_requests(self, uid: str) -> builtins.list[NodeRequest]:
        with self.engine.connect() as connection:
            rows = connection.execute(node_requests.select().where(node_requests.c.cluster_uid == uid))
            return [NodeRequest(row.node, row.kind, row.incarnation, row.requested_by, row.path) for row in rows]

    def files_being_deleted(self, path: str) -> bool:
        """Whether some cluster's loop has yet to delete this directory."""
        query = node_requests.select().where(node_requests.c.kind == DELETE_FILES, node_requests.c.path == path)
        with self.engine.connect() as connection:
            return connection.execute(query.limit(1)).first() is not None

    def events(self, namespace: str, name: str, limit: int = 200) -> builtins.list[state.Event]:
        """Events of every cluster that had this name, oldest first (events outlive a deleted cluster)."""
        return self.search_events(EventFilter(namespaces=frozenset({namespace}), cluster=name), limit)

    def search_events(self, where: EventFilter, limit: int = 200) -> builtins.list[state.Event]:
        """The newest ``limit`` events that match, oldest first."""
        query = events.select().order_by(events.c.id.desc()).limit(limit)
        if where.namespaces is not None:
            query = query.where(events.c.namespace.in_(sorted(where.namespaces)))
        if where.cluster:
            query = query.where(events.c.cluster == where.cluster)
        if where.type:
            query = query.where(events.c.type == where.type.value)
        if where.text:
            pattern = "%" + where.text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            query = query.where(
                sa.or_(
                    events.c.reason.ilike(pattern, escape="\\"),
                    events.c.message.ilike(pattern, escape="\\"),
                    events.c.node.ilike(pattern, escape="\\"),
                )
            )
        with self.engine.connect() as connection:
            rows = list(connection.execute(query))
        return [state.Event(**{**row._mapping, "time": aware(row.time)}) for row in reversed(rows)]


@functools.lru_cache(maxsize=16384)
def _spec(text: str) -> spec_mod.ClusterSpec:
    """Specs are frozen and change rarely: a fleet's reconcile passes and list calls parse each version once."""
    return spec_mod.ClusterSpec.model_validate(json.loads(text))


@functools.lru_cache(maxsize=16384)
def _status(text: str) -> state.ClusterStatus:
    return state.ClusterStatus.model_validate_json(text)


def _view(row: sa.Row[tuple[object, ...]]) -> state.ClusterView:
    mapping = row._mapping
    return state.ClusterView(
        uid=mapping["uid"],
        spec=_spec(mapping["spec"]),
        status=_status(mapping["status"]),
        generation=mapping["generation"],
        created_at=aware(mapping["created_at"]),
        deleting=bool(mapping["deleting"]),
        queued=bool(mapping["queued"]),
        queue_reason=mapping["queue_reason"],
        preempted_until=aware(mapping["preempted_until"]) if mapping["preempted_until"] else None,
        pending_spec=_spec(mapping["pending_spec"]) if mapping["pending_spec"] else None,
        pending_reason=mapping["pending_reason"],
        pending_since=aware(mapping["pending_since"]) if mapping["pending_since"] else None,
        suspended_at=aware(mapping["suspended_at"]) if mapping["suspended_at"] else None,
    )


def aware(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _sqlite_pragmas(dbapi_connection: object, _record: object) -> None:
    cursor = dbapi_connection.cursor()  # type: ignore[attr-defined]
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()
