"""The pure retry decision of a raypod job, like KubeRay's RayJob ``backoffLimit``."""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum

from raypod import spec as spec_mod
from raypod import state

# An attempt whose cluster governance preempted: it is submitted again once the cluster is admitted, and it does
# not count as one of the job's retries (the job did not fail).
PREEMPTED = "PREEMPTED"


class Decision(StrEnum):
    WAIT = "wait"
    RETRY = "retry"
    SUCCEED = "succeed"
    FAIL = "fail"
    STOP = "stop"


def decide(job: state.JobView, ray_status: str, now: datetime) -> tuple[Decision, datetime | None]:
    """What to do with a job whose current attempt Ray reports as ``ray_status``. Pure.

    An attempt that FAILED is resubmitted after an exponential backoff while retries remain; one that was
    STOPPED is not. Returns the decision and, for a retry, when to submit it.
    """
    if ray_status not in state.FINISHED_JOB_STATUSES:
        return Decision.WAIT, None
    if ray_status == "SUCCEEDED":
        return Decision.SUCCEED, None
    if ray_status == "STOPPED" or job.stop_requested:
        return Decision.STOP, None
    retries_used = sum(1 for attempt in job.attempts[:-1] if attempt.status != PREEMPTED)
    if retries_used >= job.spec.max_retries:
        return Decision.FAIL, None
    delay = min(job.spec.backoff_s * 2**retries_used, spec_mod.MAX_JOB_BACKOFF_S)
    return Decision.RETRY, now + timedelta(seconds=delay)


STATUS_OF = {
    Decision.SUCCEED: state.JobStatus.SUCCEEDED,
    Decision.FAIL: state.JobStatus.FAILED,
    Decision.STOP: state.JobStatus.STOPPED,
    Decision.RETRY: state.JobStatus.RETRYING,
}
