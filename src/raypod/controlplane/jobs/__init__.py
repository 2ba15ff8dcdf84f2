"""raypod jobs: a Ray job submitted through raypod, retried like KubeRay's RayJob ``backoffLimit``, and the
jobs plain Ray tooling submitted, found on the cluster.

Each attempt is one Ray submission (``<job id>-<n>``) on the cluster's dashboard. The pure decision is in
``retry``, storage in ``records``, the verbs in ``service``, the background follow-up in ``supervisor`` and
working-dir zips in ``packaging``.
"""

from raypod.controlplane.jobs.service import JobService
from raypod.controlplane.jobs.supervisor import JobSupervisor

__all__ = ["JobService", "JobSupervisor"]
