"""Whether raypod is about to preempt the cluster this process runs on, so a training loop can save a checkpoint
while it still can. raypod's governance preempts a lower-priority cluster when a higher-priority one needs its
place: it leaves a notice in the cluster's Ray, then stops the nodes after the grace period
(``RAYPOD_DRAIN_TIMEOUT_S``). The job is submitted again once the cluster is admitted, and resumes from its
last checkpoint.

    for step in range(start, steps):
        ...
        if step % 100 == 0 or preemption.notice():
            ray_train.save_and_report(manager, state, step, metrics)

Asking costs one small request to the cluster's GCS; loops that step thousands of times a second should ask
every few steps.
"""

from __future__ import annotations

from raypod.capabilities.governance.notice import KEY, NAMESPACE, Notice

__all__ = ["Notice", "notice"]


def notice() -> Notice | None:
    """The pending preemption notice (its deadline and reason), or None: none, or not inside a Ray process."""
    from ray.experimental import internal_kv

    if not internal_kv._internal_kv_initialized():  # type: ignore[no-untyped-call]
        return None
    return Notice.decode(internal_kv._internal_kv_get(KEY, namespace=NAMESPACE))
