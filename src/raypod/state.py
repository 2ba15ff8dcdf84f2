"""Observed state and status: what backends see, and what the control plane reports back to users.

Observations are plain frozen dataclasses built fresh on every reconcile pass; status and events are pydantic
models because they cross the wire.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from raypod import spec as spec_mod


class NodePhase(StrEnum):
    STARTING = "Starting"
    RUNNING = "Running"
    DRAINING = "Draining"
    DEAD = "Dead"
    UNKNOWN = "Unknown"  # the process lives but Ray's GCS does not answer: nothing may be concluded about it


class SidecarState(StrEnum):
    """A process the backend keeps beside a node (hang detection's agent, a workspace's IDE), as observed."""

    RUNNING = "Running"
    NOT_STARTED = "NotStarted"
    EXITED = "Exited"


class ClusterPhase(StrEnum):
    PENDING = "Pending"
    PROVISIONING = "Provisioning"
    READY = "Ready"
    DEGRADED = "Degraded"
    DELETING = "Deleting"
    QUEUED = "Queued"  # governance: waiting for its team's quota or the pool (no node runs)
    SUSPENDED = "Suspended"  # idle for its suspend_after_idle_s: no node runs until it is resumed
    FAILED = "Failed"
    UNKNOWN = "Unknown"  # raypod cannot observe the cluster right now (its GCS does not answer)


@dataclass(frozen=True)
class ObservedNode:
    """One node as the backend sees it right now."""

    name: str
    group: str
    is_head: bool
    phase: NodePhase
    started_at: float
    pid: int | None = None
    ray_node_id: str | None = None
    drain_deadline: float | None = None
    reason: str = ""
    metrics_endpoint: str | None = None  # host:port of the node's Prometheus exporter
    incarnation: str = ""  # changes whenever the node is (re)created: health and requests belong to one
    agent_endpoint: str | None = None  # host:port of the node's dashboard agent (HTTP)
    session_dir: str | None = None  # where the node's logs and spilled objects live, when the backend can see it
    memory_bytes: int | None = None  # the node's processes together (PSS), when the backend can see them
    # The sidecars the node should run, by name; reported only while the node's own processes run.
    sidecars: dict[str, SidecarState] = field(default_factory=dict)


@dataclass(frozen=True)
class ObservedCluster:
    """A cluster as the backend sees it: its nodes, endpoints, and processes no node accounts for."""

    nodes: dict[str, ObservedNode] = field(default_factory=dict)
    endpoints: dict[str, str] = field(default_factory=dict)
    stray_nodes: frozenset[str] = frozenset()
    # False when the GCS exists but did not answer: then nodes that live are UNKNOWN, not STARTING or DEAD.
    gcs_reachable: bool = True
    gcs_error: str = ""

    @property
    def head(self) -> ObservedNode | None:
        return next((node for node in self.nodes.values() if node.is_head), None)


class Condition(BaseModel):
    type: str
    status: bool
    reason: str
    message: str = ""
    last_transition: datetime


class NodeHealthState(StrEnum):
    HEALTHY = "Healthy"
    SUSPECT = "Suspect"
    UNHEALTHY = "Unhealthy"
    UNKNOWN = "Unknown"  # not assessed: starting, or not observable


class NodeStatus(BaseModel):
    name: str
    group: str
    phase: NodePhase
    is_head: bool = False
    pid: int | None = None
    ray_node_id: str | None = None
    reason: str = ""
    metrics_endpoint: str | None = None
    health: NodeHealthState = NodeHealthState.UNKNOWN
    health_reasons: list[str] = Field(default_factory=list)
    cordoned: bool = Field(False, description="Held out of automatic recovery by an operator.")


class PendingDemand(BaseModel):
    """Work the cluster's Ray cannot place yet, as its autoscaler sees it, and why it waits."""

    model_config = ConfigDict(frozen=True)

    resources: dict[str, float]  # one task's, actor's or bundle's
    count: int
    placement_group: bool = False  # ``count`` bundles of one placement group (``resources`` is its first)
    reason: str  # "nodes starting", "over quota: ...", "over max_replicas", "no node shape fits", "no room: ..."

    def describe(self) -> str:
        """``2 x {1 CPU}``, ``a placement group of 4 x {1 CPU}``."""
        amounts = ", ".join(
            f"{spec_mod.format_bytes(int(v)) if k in ('memory', 'object_store_memory') else f'{v:g}'} {k}"
            for k, v in sorted(self.resources.items())
        )
        each = f"{self.count} x {{{amounts or 'nothing'}}}"
        return f"a placement group of {each}" if self.placement_group else each


class AutoscalingStatus(BaseModel):
    model_config = ConfigDict(frozen=True)

    pending: list[PendingDemand] = Field(default_factory=list)
    message: str = ""  # what kept the autoscaler from deciding, if anything


class ClusterStatus(BaseModel):
    # Frozen: the store hands the same parsed status to every reader of an unchanged row (a fleet's passes).
    model_config = ConfigDict(frozen=True)

    phase: ClusterPhase = ClusterPhase.PENDING
    message: str = ""
    desired_nodes: int = 0
    ready_nodes: int = 0
    nodes: list[NodeStatus] = Field(default_factory=list)
    endpoints: dict[str, str] = Field(default_factory=dict)
    conditions: list[Condition] = Field(default_factory=list)
    observed_generation: int = 0
    autoscaling: AutoscalingStatus | None = None  # clusters whose groups scale from Ray's demand

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)


class EventType(StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"


class Event(BaseModel):
    """Something that happened to a cluster; ``reason`` is CamelCase past tense (``CreatedWorker``)."""

    time: datetime
    namespace: str
    cluster: str
    type: EventType = EventType.NORMAL
    reason: str
    message: str
    node: str | None = None


class ClusterView(BaseModel):
    """What the API returns for a cluster: the accepted spec and the last derived status."""

    uid: str
    spec: spec_mod.ClusterSpec
    status: ClusterStatus
    generation: int
    created_at: datetime
    deleting: bool = False
    queued: bool = Field(False, description="Waiting in the governance queue: no node runs until it is admitted.")
    queue_reason: str = ""
    preempted_until: datetime | None = Field(
        None, description="Preempted: its nodes keep running until then, so its work can save a checkpoint."
    )
    pending_spec: spec_mod.ClusterSpec | None = Field(
        None, description="A scale-up waiting in the queue for quota; ``spec`` is what runs until it is admitted."
    )
    pending_reason: str = ""
    pending_since: datetime | None = None
    suspended_at: datetime | None = Field(
        None, description="Suspended (idle): no node runs and no quota is held until it is resumed."
    )

    @property
    def suspended(self) -> bool:
        return self.suspended_at is not None


# -- jobs ----------------------------------------------------------------------------------------------------


class JobStatus(StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    RETRYING = "RETRYING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"


# A job (raypod's) or an attempt (Ray's status, the same words) that has ended: nothing changes it any more.
FINISHED_JOB_STATUSES = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED})


class SubmittedVia(StrEnum):
    RAYPOD = "raypod"  # raypod job submit, the SDK's jobs.submit, the console
    RAY = "ray"  # plain Ray tooling (ray job submit, JobSubmissionClient), found on the cluster


class Attempt(BaseModel):
    submission_id: str
    status: str = "PENDING"
    message: str = ""
    submitted_at: datetime


class JobView(BaseModel):
    id: str
    namespace: str
    cluster: str
    owner: str = Field(
        description="Who submitted it; for plain Ray tooling, who did through the gateway (empty: not through it)."
    )
    spec: spec_mod.JobSpec
    status: JobStatus
    attempts: list[Attempt] = Field(
        description="Ray submissions, oldest first; empty until the job supervisor submits the first one."
    )
    stop_requested: bool = False
    fail_requested: str | None = Field(
        default=None, description="Why raypod stops the job as FAILED (a run that hung again and again)."
    )
    next_attempt_at: datetime | None = None
    created_at: datetime
    submitted_via: SubmittedVia = SubmittedVia.RAYPOD


class DeletedCluster(BaseModel):
    """What history kept of a deleted cluster: its last view (nodes included), its events and its jobs."""

    archived_at: datetime
    cluster: ClusterView
    events: list[Event]
    jobs: list[JobView]


class JobLogs(BaseModel):
    job: str
    attempt: int | None
    logs: str


class WorkingDir(BaseModel):
    uri: str = Field(description="Pass it as runtime_env.working_dir when submitting.")


# -- identities ----------------------------------------------------------------------------------------------


class Role(StrEnum):
    ADMIN = "admin"
    MEMBER = "member"


class TokenInfo(BaseModel):
    id: str
    user: str
    name: str
    created_at: datetime
    expires_at: datetime | None = None
    revoked_at: datetime | None = None
    parent: str | None = Field(None, description="The token it was made with: it ends no later, and with it.")


class CreatedToken(TokenInfo):
    token: str = Field(description="The secret: shown this once, stored only hashed.")


class UserInfo(BaseModel):
    name: str
    is_admin: bool
    teams: dict[str, Role] = Field(default_factory=dict)


class TeamInfo(BaseModel):
    name: str


class NamespaceInfo(BaseModel):
    name: str
    team: str


class ServerInfo(BaseModel):
    version: str
    backend: str
    tenancy: str = Field(description="What separates namespaces on this backend, and what does not.")
    isolated: bool


class HangRank(BaseModel):
    """One rank of a hung run, as its node's agent saw it at the detection."""

    rank: int
    node: str | None = None
    pid: int | None = Field(None, description="In the node's process namespace.")
    reports: int = 0
    last_report: float | None = Field(None, description="Unix time of its last ray.train.report.")
    stalled_s: float | None = None
    cpu_pct: float | None = None
    gpu_pct: float | None = Field(None, description="Utilisation of its GPUs (NVML), where it has any.")
    waiting_in: str | None = Field(None, description="The innermost frame of its training thread.")
    stack: str | None = Field(None, description="py-spy dump of the process.")
    stack_error: str | None = Field(None, description="Why there is no stack (py-spy missing, ptrace denied).")
    log_tail: list[str] = Field(default_factory=list)


class HangDetection(BaseModel):
    """A Ray Train run found hung (or faulted) by the agents of its nodes, merged into one record."""

    id: str
    namespace: str
    cluster: str
    job: str | None = Field(None, description="The raypod job id, when known.")
    ray_job_id: str | None = None
    run: str | None = None
    run_id: str
    attempt: str
    kind: str = Field(description="hang (no progress), rule (a rule's timeout) or fault (a fault_on_match line).")
    rule: str | None = None
    reason: str
    action: str = Field(description="notify, cancel (hung ranks killed) or fail-job (too many hangs in a row).")
    detected_at: datetime
    last_progress: datetime | None = None
    timeout_s: float | None = None
    diagnostics_s: float | None = None
    hangs_without_progress: int = 1
    common_wait: str | None = Field(None, description="The function every rank waits in, when they share one.")
    stalled_first: list[int] = Field(default_factory=list, description="Ranks, the longest without progress first.")
    ranks: list[HangRank] = Field(default_factory=list)


class RankProgress(BaseModel):
    rank: int
    node: str | None = None
    pid: int | None = None
    reports: int = 0
    last_report: float | None = None
    stalled_s: float | None = Field(None, description="Seconds without progress (pauses excluded); None: paused.")
    timeout_s: float | None = None
    last_progress: float | None = Field(None, description="Unix time the stall timer counts from.")
    slowest_step_s: float | None = None
    paused: str | None = None
    cpu_pct: float | None = None
    gpu_pct: float | None = None


class RunProgress(BaseModel):
    """A live Ray Train run on a cluster, per rank, from the nodes' agents."""

    run_id: str
    run: str | None = None
    attempt: str | None = None
    ray_job_id: str | None = None
    job: str | None = None
    world_size: int | None = None
    hung: bool = False
    action: str | None = None
    max_hang_restarts: int | None = None
    enabled: bool = True
    ranks: list[RankProgress] = Field(default_factory=list)


# -- serving -------------------------------------------------------------------------------------------------


class ServeReplica(BaseModel):
    id: str
    state: str  # Serve's replica state (RUNNING, STARTING, ...)
    node_id: str | None = None
    pid: int | None = None


class SpaceState(StrEnum):
    READY = "Ready"  # its IDE answers
    STARTING = "Starting"
    STOPPED = "Stopped"
    UNKNOWN = "Unknown"
    DELETED = "Deleted"


class SpaceView(BaseModel):
    """A workspace as users see it. ``state``: Ready (its IDE answers), Starting, Stopped, or Unknown (its
    cluster is not observed yet)."""

    name: str
    namespace: str
    cluster: str
    kind: str
    owner: str | None
    state: SpaceState
    message: str = ""
    url: str = Field(description="Path of the IDE on raypod's server.")
    node: str = Field(description="The workspace's Ray node (0 CPUs, label raypod.io/space).")
    python_env: str | None = Field(None, description="The Python environment its kernels run in, when not raypod's.")


class DeploymentStatus(StrEnum):
    """Serve's words for an application, and raypod's own for before Serve knows it (NOT_STARTED, SUBMITTED),
    after it left (NOT_RUNNING), and while nothing can say (UNKNOWN)."""

    NOT_STARTED = "NOT_STARTED"
    SUBMITTED = "SUBMITTED"
    DEPLOYING = "DEPLOYING"
    RUNNING = "RUNNING"
    DEPLOY_FAILED = "DEPLOY_FAILED"
    UNHEALTHY = "UNHEALTHY"
    DELETING = "DELETING"
    NOT_RUNNING = "NOT_RUNNING"
    UNKNOWN = "UNKNOWN"

    @classmethod
    def of_serve(cls, value: object) -> DeploymentStatus:
        """Serve's status as one of these; one this version does not know is UNKNOWN."""
        try:
            return cls(str(value))
        except ValueError:
            return cls.UNKNOWN


class DeploymentView(BaseModel):
    """A model on a cluster's Ray Serve. ``status`` is Serve's own (NOT_STARTED while raypod checks the model's
    files before submitting it, DEPLOYING, RUNNING, DEPLOY_FAILED, UNHEALTHY, DELETING), ``UNKNOWN`` while the
    cluster's dashboard does not answer, or raypod's ``SUBMITTED`` before Serve knows the application."""

    name: str
    namespace: str
    cluster: str
    model: str
    owner: str
    spec: spec_mod.ServeDeploySpec
    created_at: datetime
    status: DeploymentStatus = DeploymentStatus.SUBMITTED
    message: str = ""
    engine: str = "cpu"
    replicas: list[ServeReplica] = Field(default_factory=list)
    openai_base_url: str = Field("", description="Path of the OpenAI-compatible API on raypod's server.")
    deploy_job: str = ""


# -- governance ----------------------------------------------------------------------------------------------


class QuotaView(BaseModel):
    team: str
    namespace: str | None = Field(None, description="Set for a namespace's own quota, a cap inside its team's.")
    quota: spec_mod.QuotaSpec
    usage: dict[str, float] = Field(description="What the team's admitted clusters hold: cpus, memory, gpus, ...")
    borrowed: dict[str, float] = Field(default_factory=dict, description="Of the usage, what runs on borrowed quota.")
    queued: int = 0


class OwnerDeleted(BaseModel):
    """What deleting a user did to its clusters."""

    user: str
    dropped_from_queue: list[str] = Field(description="Its queued clusters (namespace/name): deleted, with an event.")
    kept: list[str] = Field(description="Its admitted clusters: they run on, for their team's admins to manage.")


class QueueEntry(BaseModel):
    namespace: str
    name: str
    kind: str = Field("cluster", description="cluster (it waits to start) or scale (a running cluster's scale-up).")
    team: str
    priority: str
    position: int
    reason: str
    submitted_at: datetime


# -- audit ---------------------------------------------------------------------------------------------------


class AuditEntry(BaseModel):
    """One change someone asked for, and how it ended. ``hash`` chains it to the entry before it."""

    seq: int
    time: datetime
    actor: str = Field(description="The user; empty when the request carried no valid credentials.")
    token_id: str = Field("", description="The API token presented, or the one its session was made from.")
    via: str = Field("", description="token, session, or empty")
    source: str = Field(description="api, console, gateway (operate requests to a cluster) or login")
    action: str = Field(description="The method and path, without the query string.")
    target: str = Field("", description="namespace/cluster where the path names one.")
    client: str = ""
    result: int = Field(description="The HTTP status the request was answered with.")
    hash: str = ""


class AuditVerification(BaseModel):
    intact: bool
    entries: int
    first_bad: int | None = Field(None, description="The first entry (seq) whose chain does not hold.")
    message: str


# -- schedules -----------------------------------------------------------------------------------------------


class ScheduleView(BaseModel):
    spec: spec_mod.ScheduleSpec
    owner: str = Field(description="Whose rights its runs are submitted with.")
    created_at: datetime
    last_scheduled_at: datetime | None = Field(None, description="The latest scheduled time a run was made for.")
    next_run_at: datetime | None = Field(None, description="None while suspended.")
    last_message: str = Field("", description="What happened at the latest scheduled time (run, skipped, failed).")
    runs: list[JobView] = Field(default_factory=list, description="Its latest runs (history_limit of them).")
