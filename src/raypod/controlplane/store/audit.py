"""How the audit log is stored (the table is in ``store/schema.py``): appended to under one lock, never updated."""

from __future__ import annotations

import builtins
import threading
from collections.abc import Callable, Iterator
from datetime import datetime

import sqlalchemy as sa

from raypod import state
from raypod.controlplane.store import schema

BATCH = 1000


class AuditStore:
    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self._lock = threading.Lock()

    def append(self, entry: state.AuditEntry, seal: Callable[[state.AuditEntry, str], str]) -> state.AuditEntry:
        """Store ``entry`` as the next one, its hash ``seal(entry, previous hash)``; return it as stored."""
        table = schema.audit_log
        with self._lock, self.engine.begin() as connection:
            newest = sa.select(table.c.seq, table.c.hash).order_by(table.c.seq.desc()).limit(1)
            last = connection.execute(newest).first()
            seq, previous = (last[0] + 1, last[1]) if last is not None else (1, "")
            entry = entry.model_copy(update={"seq": seq})
            entry = entry.model_copy(update={"hash": seal(entry, previous)})
            connection.execute(table.insert().values(**entry.model_dump()))
        return entry

    def list(
        self,
        *,
        actor: str | None = None,
        target: str | None = None,
        since: datetime | None = None,
        limit: int = 200,
    ) -> builtins.list[state.AuditEntry]:
        """The newest ``limit`` entries that match, oldest first."""
        table = schema.audit_log
        query = sa.select(table)
        if actor is not None:
            query = query.where(table.c.actor == actor)
        if target is not None:
            query = query.where(table.c.target == target)
        if since is not None:
            query = query.where(table.c.time >= since)
        with self.engine.connect() as connection:
            rows = connection.execute(query.order_by(table.c.seq.desc()).limit(limit)).mappings().all()
        return [state.AuditEntry.model_validate(dict(row)) for row in reversed(rows)]

    def all(self) -> Iterator[state.AuditEntry]:
        """Every entry in order, read a batch at a time."""
        table = schema.audit_log
        after = 0
        while True:
            with self.engine.connect() as connection:
                query = sa.select(table).where(table.c.seq > after).order_by(table.c.seq).limit(BATCH)
                rows = connection.execute(query).mappings().all()
            if not rows:
                return
            for row in rows:
                yield state.AuditEntry.model_validate(dict(row))
            after = rows[-1]["seq"]
