"""The preemption notice raypod leaves in a cluster's Ray (GCS key-value store) before it stops the cluster's nodes.
A leaf module: the server writes it, training processes read it (``raypod.checkpoint.preemption``)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

NAMESPACE = b"raypod"
KEY = b"preemption"


@dataclass(frozen=True)
class Notice:
    deadline: float  # epoch seconds: the nodes stop then
    reason: str

    @property
    def seconds_left(self) -> float:
        return max(0.0, self.deadline - time.time())

    def encode(self) -> bytes:
        return json.dumps({"deadline": self.deadline, "reason": self.reason}).encode()

    @classmethod
    def decode(cls, raw: bytes | None, now: float | None = None) -> Notice | None:
        """The notice in ``raw``, or None: none, unreadable, or one whose deadline has passed (a cluster that
        keeps its GCS across a restart keeps an old notice: it is stale once the cluster runs again)."""
        if not raw:
            return None
        try:
            found = json.loads(raw)
            notice = cls(deadline=float(found["deadline"]), reason=str(found.get("reason", "")))
        except (ValueError, KeyError, TypeError):
            return None
        return notice if notice.deadline > (time.time() if now is None else now) else None
