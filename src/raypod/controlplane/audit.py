"""The audit log: who asked for which change, from where, and how it ended; append-only and hash-chained.

Each entry's hash is SHA-256 over the previous entry's hash and the entry's own fields, so editing or deleting a
past entry breaks the chain from there on; the newest entry's sequence number and hash are also kept in a file
beside the database (``audit.head``, 0600), so dropping the newest entries is detected too. ``verify`` walks it.
What is recorded never holds a secret: the method and path without the query string, never a body or a header.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import logging
import os
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from raypod import state
from raypod.controlplane import identity, store
from raypod.controlplane.store.audit import AuditStore

log = logging.getLogger(__name__)

HEAD_FILE = "audit.head"


def seal(entry: state.AuditEntry, previous: str) -> str:
    fields = entry.model_dump(mode="json", exclude={"hash", "time"})
    # The same instant however the database gives it back (SQLite drops the zone).
    when = entry.time if entry.time.tzinfo is not None else entry.time.replace(tzinfo=UTC)
    fields["time"] = when.astimezone(UTC).isoformat()
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(f"{previous}\n{canonical}".encode()).hexdigest()


class AuditLog:
    def __init__(self, db: store.Store, home: Path) -> None:
        self.records = AuditStore(db.engine)
        self._head = home / HEAD_FILE
        self._lock = threading.Lock()

    def record(
        self,
        *,
        actor: str,
        token_id: str,
        via: str,
        source: str,
        action: str,
        target: str,
        client: str,
        result: int,
    ) -> state.AuditEntry:
        entry = state.AuditEntry(
            seq=0,
            time=store.now(),
            actor=actor[:63],
            token_id=token_id[:64],
            via=via,
            source=source,
            action=action[:512],
            target=target[:200],
            client=client[:64],
            result=result,
        )
        with self._lock:
            stored = self.records.append(entry, seal)
            self._write_head(stored)
        return stored

    def list(
        self,
        caller: identity.Principal,
        *,
        user: str | None = None,
        cluster: str | None = None,
        since: datetime | None = None,
        limit: int = 200,
    ) -> builtins.list[state.AuditEntry]:
        """Raises Forbidden: installation admins only (the log names every team's users and clusters)."""
        identity.require_admin(caller, "read the audit log")
        return self.records.list(actor=user, target=cluster, since=since, limit=limit)

    def export(self, caller: identity.Principal) -> Iterator[str]:
        """Every entry as a JSON line, oldest first. Raises Forbidden (admins only)."""
        identity.require_admin(caller, "export the audit log")
        for entry in self.records.all():
            yield entry.model_dump_json() + "\n"

    def verify(self, caller: identity.Principal) -> state.AuditVerification:
        """Walk the chain: each entry's hash must cover the one before it, the sequence must have no gap, and the
        newest entry must be the one the head file names. Raises Forbidden (admins only)."""
        identity.require_admin(caller, "verify the audit log")
        previous, count, last_seq = "", 0, 0
        for entry in self.records.all():
            count += 1
            if entry.seq != last_seq + 1:
                return _broken(count, entry.seq, f"entries {last_seq + 1} to {entry.seq - 1} are missing")
            if seal(entry, previous) != entry.hash:
                return _broken(count, entry.seq, f"entry {entry.seq} was changed after it was written")
            previous, last_seq = entry.hash, entry.seq
        head = self._read_head()
        if head is not None and (head[0] != last_seq or head[1] != previous):
            message = f"the newest entry should be {head[0]}, the log ends at {last_seq}: entries were removed"
            return _broken(count, last_seq + 1 if head[0] > last_seq else head[0], message)
        return state.AuditVerification(intact=True, entries=count, message=f"{count} entries, chain intact")

    def _write_head(self, entry: state.AuditEntry) -> None:
        temporary = self._head.with_suffix(".tmp")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as out:
            out.write(f"{entry.seq} {entry.hash}\n")
        os.replace(temporary, self._head)

    def _read_head(self) -> tuple[int, str] | None:
        try:
            seq, digest = self._head.read_text().split()
            return int(seq), digest
        except (OSError, ValueError):
            return None


def _broken(count: int, seq: int, message: str) -> state.AuditVerification:
    return state.AuditVerification(intact=False, entries=count, first_bad=seq, message=message)
