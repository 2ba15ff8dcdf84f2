"""How schedules are stored (the table is in ``store/schema.py``)."""

from __future__ import annotations

import builtins
from datetime import datetime

import sqlalchemy as sa

from raypod import errors, state
from raypod import spec as spec_mod
from raypod.controlplane.store import aware, now, schema

table = schema.schedules


class ScheduleStore:
    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine

    def insert(self, spec: spec_mod.ScheduleSpec, owner: str) -> None:
        """Raises AlreadyExists."""
        try:
            with self.engine.begin() as connection:
                connection.execute(
                    table.insert().values(
                        namespace=spec.namespace,
                        name=spec.name,
                        owner=owner,
                        spec=spec.model_dump_json(),
                        created_at=now(),
                        last_message="",
                    )
                )
        except sa.exc.IntegrityError:
            exists = f"schedule '{spec.name}' already exists in namespace '{spec.namespace}'"
            raise errors.AlreadyExists(exists) from None

    def get(self, namespace: str, name: str) -> state.ScheduleView:
        """Raises NotFound."""
        with self.engine.connect() as connection:
            row = connection.execute(table.select().where(table.c.namespace == namespace, table.c.name == name)).first()
        if row is None:
            raise errors.NotFound(f"schedule '{name}' not found in namespace '{namespace}'")
        return _view(row)

    def list(self, namespaces: set[str] | None = None) -> builtins.list[state.ScheduleView]:
        query = table.select().order_by(table.c.namespace, table.c.name)
        if namespaces is not None:
            query = query.where(table.c.namespace.in_(sorted(namespaces)))
        with self.engine.connect() as connection:
            return [_view(row) for row in connection.execute(query)]

    def save_spec(self, spec: spec_mod.ScheduleSpec) -> None:
        with self.engine.begin() as connection:
            connection.execute(
                table.update()
                .where(table.c.namespace == spec.namespace, table.c.name == spec.name)
                .values(spec=spec.model_dump_json())
            )

    def fired(self, namespace: str, name: str, scheduled_for: datetime, message: str) -> None:
        with self.engine.begin() as connection:
            connection.execute(
                table.update()
                .where(table.c.namespace == namespace, table.c.name == name)
                .values(last_scheduled_at=scheduled_for, last_message=message[:2000])
            )

    def delete(self, namespace: str, name: str) -> None:
        with self.engine.begin() as connection:
            connection.execute(table.delete().where(table.c.namespace == namespace, table.c.name == name))


def _view(row: sa.Row[tuple[object, ...]]) -> state.ScheduleView:
    mapping = row._mapping
    last = mapping["last_scheduled_at"]
    return state.ScheduleView(
        spec=spec_mod.ScheduleSpec.model_validate_json(mapping["spec"]),
        owner=mapping["owner"],
        created_at=aware(mapping["created_at"]),
        last_scheduled_at=aware(last) if last else None,
        last_message=mapping["last_message"],
    )
