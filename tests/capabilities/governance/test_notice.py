"""The preemption notice's format: what the server writes is what a training process reads, and a notice whose
deadline has passed (left in a GCS that outlived the preemption) is no notice."""

from __future__ import annotations

from raypod.capabilities.governance.notice import Notice


def test_a_notice_reads_back_until_its_deadline() -> None:
    written = Notice(deadline=1000.0, reason="preempted for ml/urgent (priority 1000)")
    assert Notice.decode(written.encode(), now=999.0) == written
    assert Notice.decode(written.encode(), now=1000.0) is None


def test_no_or_unreadable_notice_is_none() -> None:
    for raw in (None, b"", b"not json", b"{}", b'{"deadline": "soon"}', b"[1]"):
        assert Notice.decode(raw, now=0.0) is None
