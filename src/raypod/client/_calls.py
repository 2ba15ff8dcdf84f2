"""What every part of the SDK shares: checked names and paths, and polling until a state is reached."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import TypeVar

from raypod import errors
from raypod import spec as spec_mod

T = TypeVar("T")


def quota_path(team: str | None, namespace: str | None) -> str:
    if (team is None) == (namespace is None):
        raise errors.InvalidSpec("give a team or a namespace, not both")
    if namespace is not None:
        return f"/api/v1/namespaces/{checked_name(namespace)}/quota"
    return f"/api/v1/teams/{checked_name(team or '')}/quota"


def checked_name(value: str, what: str = "name") -> str:
    if not spec_mod.is_dns_label(value):
        raise errors.InvalidSpec(f"{what} '{value[:80]}' is not a valid DNS-1123 label")
    return value


def checked_job_id(value: str) -> str:
    """raypod's id (rj-...) or Ray's submission id of one of the job's attempts (raysubmit_...)."""
    if not re.match(spec_mod.JOB_ID_PATTERN, value):
        raise errors.InvalidSpec(
            f"'{value[:40]}' is not a job id (raypod's rj-... or Ray's raysubmit_...); see 'raypod job list'"
        )
    return value


def namespaced_path(namespace: str, name: str, verb: str | None = None) -> str:
    path = f"/api/v1/namespaces/{checked_name(namespace, 'namespace')}/clusters/{checked_name(name, 'cluster name')}"
    return f"{path}/{verb}" if verb else path


def poll(
    fetch: Callable[[], T],
    done: Callable[[T], bool],
    *,
    timeout: float,
    every: float,
    late: Callable[[T], str],
    on_progress: Callable[[T], None] | None = None,
    failed: Callable[[T], errors.RaypodError | None] = lambda _: None,
) -> T:
    """``fetch()`` every ``every`` s until ``done`` says so. Raises what ``failed`` returns for an answer that will
    not get better, and TransientError(``late(last answer)``) past ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        found = fetch()
        if on_progress:
            on_progress(found)
        if done(found):
            return found
        problem = failed(found)
        if problem is not None:
            raise problem
        if time.monotonic() > deadline:
            raise errors.TransientError(late(found))
        time.sleep(every)
