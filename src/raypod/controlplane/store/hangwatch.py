"""How hang detections are stored (the table is in ``store/schema.py``)."""

from __future__ import annotations

import builtins
from collections.abc import Callable

import sqlalchemy as sa

from raypod import state
from raypod.controlplane.store import schema


class HangStore:
    """Hang detections, one row per run attempt, kept after their cluster is gone."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine

    def merge(
        self,
        uid: str,
        found: state.HangDetection,
        combine: Callable[[state.HangDetection, state.HangDetection], state.HangDetection],
    ) -> tuple[state.HangDetection, bool]:
        """Store ``found``, or ``combine`` it with the record of the same run attempt (in one transaction); return
        the stored detection and whether it is new."""
        table = schema.hang_detections
        with self.engine.begin() as connection:
            row = connection.execute(sa.select(table.c.detection).where(table.c.id == found.id)).first()
            if row is None:
                connection.execute(
                    table.insert().values(
                        id=found.id,
                        cluster_uid=uid,
                        namespace=found.namespace,
                        cluster=found.cluster,
                        job=found.job,
                        detected_at=found.detected_at,
                        detection=found.model_dump_json(),
                    )
                )
                return found, True
            merged = combine(state.HangDetection.model_validate_json(row[0]), found)
            connection.execute(
                table.update()
                .where(table.c.id == found.id)
                .values(job=merged.job, detected_at=merged.detected_at, detection=merged.model_dump_json())
            )
            return merged, False

    def list(
        self, namespace: str, cluster: str, job: str | None = None, limit: int = 100
    ) -> builtins.list[state.HangDetection]:
        table = schema.hang_detections
        query = sa.select(table.c.detection).where(table.c.namespace == namespace, table.c.cluster == cluster)
        if job is not None:
            query = query.where(table.c.job == job)
        query = query.order_by(table.c.detected_at.desc()).limit(limit)
        with self.engine.connect() as connection:
            return [state.HangDetection.model_validate_json(r[0]) for r in connection.execute(query)]
