"""How the model catalog and model deployments are stored (tables in ``store/schema.py``)."""

from __future__ import annotations

import builtins
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from raypod.controlplane.store import schema
from raypod.serving import catalog


class CatalogStore:
    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine

    def request(self, source: catalog.ModelSource, *, replace: bool, by: str, at: datetime) -> None:
        """Store a request to add ``source`` (replacing a failed request for the same id)."""
        table = schema.model_additions
        values = {"source": source.model_dump_json(), "replace": replace, "requested_by": by, "requested_at": at}
        with self.engine.begin() as connection:
            connection.execute(table.delete().where(table.c.id == source.id))
            connection.execute(table.insert().values(id=source.id, failure=None, **values))

    def addition(self, model_id: str) -> dict[str, Any] | None:
        table = schema.model_additions
        with self.engine.connect() as connection:
            row = connection.execute(sa.select(table).where(table.c.id == model_id)).first()
        return dict(row._mapping) if row else None

    def additions(self) -> builtins.list[dict[str, Any]]:
        """Requests the serving applier has still to read (not failed), oldest first."""
        table = schema.model_additions
        query = sa.select(table).where(table.c.failure.is_(None)).order_by(table.c.requested_at)
        with self.engine.connect() as connection:
            return [dict(row._mapping) for row in connection.execute(query)]

    def added(self, request: dict[str, Any], entry: catalog.ModelEntry) -> None:
        """Write the entry a request gave and forget the request, in one transaction; nothing if the request was
        withdrawn or asked again meanwhile (another ``requested_at``): that one is read on the next pass."""
        table, additions = schema.models, schema.model_additions
        values = {"entry": entry.model_dump_json(), "added_by": entry.added_by, "added_at": entry.added_at}
        with self.engine.begin() as connection:
            mine = sa.and_(additions.c.id == request["id"], additions.c.requested_at == request["requested_at"])
            if connection.execute(additions.delete().where(mine)).rowcount != 1:
                return
            if connection.execute(table.update().where(table.c.id == entry.id).values(**values)).rowcount == 0:
                connection.execute(table.insert().values(id=entry.id, **values))

    def addition_failed(self, request: dict[str, Any], failure: str) -> None:
        table = schema.model_additions
        mine = sa.and_(table.c.id == request["id"], table.c.requested_at == request["requested_at"])
        with self.engine.begin() as connection:
            connection.execute(table.update().where(mine).values(failure=failure))

    def list(self) -> builtins.list[catalog.ModelEntry]:
        with self.engine.connect() as connection:
            rows = connection.execute(sa.select(schema.models.c.entry).order_by(schema.models.c.id))
            return [catalog.ModelEntry.model_validate_json(row[0]) for row in rows]

    def get(self, model_id: str) -> catalog.ModelEntry | None:
        with self.engine.connect() as connection:
            row = connection.execute(sa.select(schema.models.c.entry).where(schema.models.c.id == model_id)).first()
        return catalog.ModelEntry.model_validate_json(row[0]) if row else None

    def delete(self, model_id: str) -> None:
        """The entry and any request to add it."""
        with self.engine.begin() as connection:
            connection.execute(schema.models.delete().where(schema.models.c.id == model_id))
            connection.execute(schema.model_additions.delete().where(schema.model_additions.c.id == model_id))


class DeploymentStore:
    """One row per model deployment of a cluster: what was asked for, and the submission that applied it."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine

    def save(self, cluster_uid: str, name: str, values: dict[str, Any]) -> None:
        table = schema.deployments
        with self.engine.begin() as connection:
            where = sa.and_(table.c.cluster_uid == cluster_uid, table.c.name == name)
            if connection.execute(sa.select(table.c.name).where(where)).first():
                connection.execute(table.update().where(where).values(**values))
            else:
                connection.execute(table.insert().values(cluster_uid=cluster_uid, name=name, **values))

    def of_cluster(self, cluster_uid: str, name: str | None = None) -> builtins.list[dict[str, Any]]:
        table = schema.deployments
        query = sa.select(table).where(table.c.cluster_uid == cluster_uid).order_by(table.c.name)
        if name is not None:
            query = query.where(table.c.name == name)
        with self.engine.connect() as connection:
            return [dict(row._mapping) for row in connection.execute(query)]

    def pending(self) -> builtins.list[dict[str, Any]]:
        """Deployments the applier has work for: not yet submitted (nor failed), or asked to be deleted."""
        table = schema.deployments
        unsubmitted = sa.and_(table.c.deploy_job == "", table.c.failure.is_(None))
        query = sa.select(table).where(sa.or_(unsubmitted, table.c.delete_requested)).order_by(table.c.created_at)
        with self.engine.connect() as connection:
            return [dict(row._mapping) for row in connection.execute(query)]

    def applied(self, record: dict[str, Any], values: dict[str, Any]) -> None:
        """Write what applying ``record`` gave (its submission, or why it failed), unless the deployment was
        asked for again meanwhile (a newer ``created_at``): that one is applied on the next pass."""
        table = schema.deployments
        where = sa.and_(
            table.c.cluster_uid == record["cluster_uid"],
            table.c.name == record["name"],
            table.c.created_at == record["created_at"],
        )
        with self.engine.begin() as connection:
            connection.execute(table.update().where(where).values(**values))

    def request_delete(self, cluster_uid: str, name: str) -> None:
        table = schema.deployments
        with self.engine.begin() as connection:
            connection.execute(
                table.update()
                .where(table.c.cluster_uid == cluster_uid, table.c.name == name)
                .values(delete_requested=True)
            )

    def delete(self, cluster_uid: str, name: str) -> None:
        table = schema.deployments
        with self.engine.begin() as connection:
            connection.execute(table.delete().where(table.c.cluster_uid == cluster_uid, table.c.name == name))
