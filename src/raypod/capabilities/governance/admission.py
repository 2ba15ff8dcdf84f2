"""Pure admission: which queued workloads run now, given teams' quotas, what runs, and the pool. No I/O, no clock.

Order: higher priority first; among equal priorities, the team with the smallest share of its quota in use goes
next (fair share), and a team's own workloads go first come, first served. A workload starts when it fits its
team's quota, or, for a team allowed to borrow, the quota other teams leave idle (recorded as a borrow); and the
pool (the machines). A workload the pool cannot hold blocks every workload after it in the order, so a large one
is not starved by a stream of small ones; one held back only by its own team's quota blocks nobody else.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields, replace

RESOURCES = ("cpus", "memory", "gpus", "clusters", "nodes")
POOL_RESOURCES = ("cpus", "memory", "gpus")  # what machines hold; counts of clusters and nodes are quotas' only


@dataclass(frozen=True, slots=True)
class Resources:
    cpus: float = 0.0
    memory: int = 0
    gpus: int = 0
    clusters: int = 0
    nodes: int = 0

    # Spelled out, not looped over RESOURCES: admission adds and subtracts these hundreds of times a decision.
    def __add__(self, other: Resources) -> Resources:
        return Resources(
            self.cpus + other.cpus,
            self.memory + other.memory,
            self.gpus + other.gpus,
            self.clusters + other.clusters,
            self.nodes + other.nodes,
        )

    def __sub__(self, other: Resources) -> Resources:
        return Resources(
            self.cpus - other.cpus,
            self.memory - other.memory,
            self.gpus - other.gpus,
            self.clusters - other.clusters,
            self.nodes - other.nodes,
        )


@dataclass(frozen=True)
class Quota:
    """A team's limits; None is unlimited. ``borrow``: it may use what other teams' quotas leave idle."""

    cpus: float | None = None
    memory: int | None = None
    gpus: int | None = None
    clusters: int | None = None
    nodes: int | None = None
    borrow: bool = False

    def over(self, usage: Resources) -> list[str]:
        """The resources ``usage`` exceeds, in words: ``cpus 10/8``."""
        found = []
        for name in RESOURCES:
            limit = getattr(self, name)
            if limit is not None and getattr(usage, name) > limit:
                found.append(f"{name} {_amount(name, getattr(usage, name))}/{_amount(name, limit)}")
        return found


UNLIMITED = Quota()


@dataclass(frozen=True)
class Workload:
    id: str
    team: str
    priority: int
    submitted_at: float
    demand: Resources
    namespace: str = ""  # a namespace with its own quota caps its workloads within the team's
    may_borrow: bool = True  # False for a running workload's growth: a workload borrows whole or not at all


@dataclass(frozen=True)
class Running:
    workload: Workload
    borrowed: bool = False  # it runs on quota another team left idle: the first to give it back


@dataclass(frozen=True)
class Admission:
    admitted: list[str] = field(default_factory=list)
    borrowed: list[str] = field(default_factory=list)  # of admitted: beyond their team's own quota
    preempted: dict[str, str] = field(default_factory=dict)  # running id -> why it must stop (gracefully)
    # Why the workloads it looked at wait; any other waits behind its team's earlier work, or behind
    # ``blocked_by``, the first workload the pool cannot hold (``why_waiting`` says which).
    waiting: dict[str, str] = field(default_factory=dict)
    blocked_by: str | None = None

    def why_waiting(self, id_: str) -> str:
        if id_ in self.waiting:
            return self.waiting[id_]
        if self.blocked_by is not None:
            return f"behind {self.blocked_by}, which the pool cannot hold yet"
        return "behind its team's earlier work"


def order(queue: Iterable[Workload], usage: Mapping[str, Resources], quotas: Mapping[str, Quota]) -> list[Workload]:
    """The queue's order: priority, then fair share between teams (the smallest share of its quota in use goes
    next, counting what goes before it), then submission time. What ``admit`` follows; for listing positions."""
    by_priority: dict[int, dict[str, list[Workload]]] = {}
    for item in sorted(queue, key=lambda w: (w.submitted_at, w.id)):
        by_priority.setdefault(item.priority, {}).setdefault(item.team, []).append(item)
    used = {team: Resources() + amount for team, amount in usage.items()}
    ordered: list[Workload] = []
    for priority in sorted(by_priority, reverse=True):
        teams = by_priority[priority]
        heap = [
            (share(used.get(t, Resources()), quotas.get(t, UNLIMITED)), m[0].submitted_at, t) for t, m in teams.items()
        ]
        heapq.heapify(heap)
        position = {team: 0 for team in teams}
        while heap:
            _, _, team = heapq.heappop(heap)
            item = teams[team][position[team]]
            position[team] += 1
            ordered.append(item)
            used[team] = used.get(team, Resources()) + item.demand
            if position[team] < len(teams[team]):
                nxt = teams[team][position[team]]
                heapq.heappush(heap, (share(used[team], quotas.get(team, UNLIMITED)), nxt.submitted_at, team))
    return ordered


class WorkQueue:
    """Queued workloads indexed by priority, then team, each team's in submission order: admission reads only
    the head of each team's line, so deciding costs the same with ten workloads queued or ten thousand."""

    def __init__(self, items: Iterable[Workload] = ()) -> None:
        self._lines: dict[int, dict[str, list[Workload]]] = {}
        self._where: dict[str, Workload] = {}
        for item in items:
            self.add(item)

    def add(self, item: Workload) -> None:
        self.remove(item.id)
        line = self._lines.setdefault(item.priority, {}).setdefault(item.team, [])
        bisect.insort(line, item, key=lambda w: (w.submitted_at, w.id))
        self._where[item.id] = item

    def remove(self, id_: str) -> None:
        item = self._where.pop(id_, None)
        if item is None:
            return
        teams = self._lines[item.priority]
        teams[item.team].remove(item)
        if not teams[item.team]:
            del teams[item.team]
            if not teams:
                del self._lines[item.priority]

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, id_: object) -> bool:
        return id_ in self._where

    def __iter__(self) -> Iterator[Workload]:
        return iter(list(self._where.values()))

    def lines(self) -> list[dict[str, list[Workload]]]:
        """Per priority, from the highest down: team -> its line."""
        return [self._lines[p] for p in sorted(self._lines, reverse=True)]


def admit(
    queue: WorkQueue | Iterable[Workload],
    running: Iterable[Running],
    quotas: Mapping[str, Quota],
    pool: Resources | None,
    namespace_quotas: Mapping[str, Quota] | None = None,
) -> Admission:
    """Decide the queue against what runs, ``quotas`` and ``pool`` (None: unlimited).

    Each team's workloads go in submission order: a team whose next workload does not fit its quota waits as a
    whole (none of its later workloads overtakes it). A namespace with its own quota (``namespace_quotas``, never
    borrowed) caps its workloads inside the team's: one held back by it holds back its namespace's later workloads
    only, and the team's other namespaces go on. The cost is a heap operation per team and per admitted workload,
    whatever the queue's length. Positions in line come from ``order``.

    Preemption (the caller stops them gracefully, then they are queued again): borrowed workloads whose lenders
    now need their quota back, and, for the first workload the pool cannot hold, lower-priority workloads whose
    end makes room (borrowed ones first, then the lowest priority, newest first)."""
    current = list(running)
    ledger = _Ledger(quotas)
    for run in current:
        ledger.add(run.workload.team, run.workload.demand, borrowed=run.borrowed)
    used, lent = ledger.used, ledger.lent
    namespace_quotas = namespace_quotas or {}
    in_namespace: dict[str, Resources] = {}
    for run in current:
        if run.workload.namespace in namespace_quotas:
            name = run.workload.namespace
            in_namespace[name] = in_namespace.get(name, Resources()) + run.workload.demand
    namespace_held: set[str] = set()  # namespaces whose earlier workload their quota holds back
    lines = queue if isinstance(queue, WorkQueue) else WorkQueue(queue)
    result = Admission()
    admitted: dict[str, Workload] = {}
    blocked: Workload | None = None  # the first workload the pool cannot hold: nothing after it starts
    for teams in lines.lines():
        if blocked is not None:
            break
        heap = [
            (share(used.get(t, Resources()), quotas.get(t, UNLIMITED)), m[0].submitted_at, t) for t, m in teams.items()
        ]
        heapq.heapify(heap)
        next_in_line = dict.fromkeys(teams, 0)
        while heap and blocked is None:
            _, _, team = heapq.heappop(heap)
            members = teams[team]
            item = members[next_in_line[team]]
            namespace_quota = namespace_quotas.get(item.namespace)
            if namespace_quota is not None:
                if item.namespace in namespace_held:
                    result.waiting[item.id] = f"behind namespace {item.namespace}'s earlier work"
                else:
                    held = namespace_quota.over(in_namespace.get(item.namespace, Resources()) + item.demand)
                    if held:
                        namespace_held.add(item.namespace)
                        result.waiting[item.id] = f"namespace {item.namespace} is at its quota: " + ", ".join(held)
                if item.id in result.waiting:
                    next_in_line[team] += 1  # the team's other namespaces go on
                    if next_in_line[team] < len(members):
                        nxt = members[next_in_line[team]]
                        heapq.heappush(
                            heap,
                            (share(used.get(team, Resources()), quotas.get(team, UNLIMITED)), nxt.submitted_at, team),
                        )
                    continue
            quota = quotas.get(team, UNLIMITED)
            own = used.get(team, Resources()) - lent.get(team, Resources())
            over = quota.over(own + item.demand)
            borrow = False
            if over and quota.borrow and item.may_borrow and _fits(_limited(item.demand, quota), ledger.idle_for(team)):
                over, borrow = [], True  # the whole workload runs on borrowed quota: the first to give it back
            if over:
                result.waiting[item.id] = f"team {team} is at its quota: " + ", ".join(over)
                continue  # the team waits as a whole
            total = ledger.total + item.demand
            if pool is not None and not _fits(_machines(total), pool):
                blocked = item
                short = [n for n in POOL_RESOURCES if getattr(total, n) > getattr(pool, n)]
                why = "the pool is full: " + ", ".join(
                    f"{n} {_amount(n, getattr(total, n))}/{_amount(n, getattr(pool, n))}" for n in short
                )
                victims = _make_room(item, current, _machines(total - pool), result.preempted, within_quota=not borrow)
                for victim in victims:
                    result.preempted[victim] = f"for {item.id} (priority {item.priority})"
                result.waiting[item.id] = why + (f"; preempting {', '.join(victims)}" if victims else "")
                break
            result.admitted.append(item.id)
            admitted[item.id] = item
            ledger.add(team, item.demand, borrowed=borrow)
            if namespace_quota is not None:
                in_namespace[item.namespace] = in_namespace.get(item.namespace, Resources()) + item.demand
            if borrow:
                result.borrowed.append(item.id)
            next_in_line[team] += 1
            if next_in_line[team] < len(members):
                heapq.heappush(heap, (share(used[team], quota), members[next_in_line[team]].submitted_at, team))
    for late in reversed(list(result.borrowed)):  # lenders admitted after a borrow in this pass come first
        if ledger.within_idle():
            break
        item = admitted.pop(late)
        result.admitted.remove(late)
        result.borrowed.remove(late)
        result.waiting[late] = "the quota it would borrow is needed by the team that lends it"
        ledger.add(item.team, item.demand, borrowed=True, sign=-1)
    for victim in _reclaim(current, ledger, result.preempted):
        result.preempted[victim] = "because its borrowed quota is needed back by the team that lent it"
    return replace(result, blocked_by=blocked.id if blocked else None)


def _make_room(
    item: Workload, current: list[Running], excess: Resources, taken: Mapping[str, str], *, within_quota: bool
) -> list[str]:
    """Running workloads whose end frees ``excess``: lower-priority ones, and, for a workload within its own team's
    quota, any running on borrowed quota (borrowed first, then the lowest priority, newest first)."""

    def may_go(run: Running) -> bool:
        return run.workload.priority < item.priority or (
            within_quota and run.borrowed and run.workload.team != item.team
        )

    candidates = sorted(
        (r for r in current if may_go(r) and r.workload.id not in taken),
        key=lambda r: (not r.borrowed, r.workload.priority, -r.workload.submitted_at),
    )
    chosen: list[str] = []
    freed = Resources()
    for run in candidates:
        if _fits(_positive(excess), freed):
            break
        chosen.append(run.workload.id)
        freed = freed + run.workload.demand
    return chosen if _fits(_positive(excess), freed) else []


def _reclaim(current: list[Running], ledger: _Ledger, taken: Mapping[str, str]) -> list[str]:
    """Borrowed workloads to stop so what is borrowed fits again in what the lenders leave idle."""
    chosen: list[str] = []
    borrowed = sorted(
        (r for r in current if r.borrowed and r.workload.id not in taken),
        key=lambda r: (r.workload.priority, -r.workload.submitted_at),
    )
    for run in borrowed:
        if ledger.within_idle():
            break
        chosen.append(run.workload.id)
        ledger.add(run.workload.team, run.workload.demand, borrowed=True, sign=-1)
    return chosen


class _Ledger:
    """What each team uses (and of it, borrows), and the quota teams leave unused, kept up to date workload by
    workload: a decision touches only the team that changed."""

    def __init__(self, quotas: Mapping[str, Quota]) -> None:
        self.quotas = quotas
        self.used: dict[str, Resources] = {}
        self.lent: dict[str, Resources] = {}
        self.total = Resources()
        self.borrowed = Resources()
        self._unused = {team: _unused_by(Resources(), quota) for team, quota in quotas.items()}
        self.unused = sum(self._unused.values(), Resources())
        self._limited = [n for n in RESOURCES if any(getattr(q, n) is not None for q in quotas.values())]

    def add(self, team: str, demand: Resources, *, borrowed: bool, sign: int = 1) -> None:
        change = demand if sign > 0 else Resources() - demand
        self.used[team] = self.used.get(team, Resources()) + change
        self.total = self.total + change
        if borrowed:
            self.lent[team] = self.lent.get(team, Resources()) + change
            self.borrowed = self.borrowed + change
        elif team in self.quotas:
            before = self._unused[team]
            self._unused[team] = _unused_by(self.used[team] - self.lent.get(team, Resources()), self.quotas[team])
            self.unused = self.unused - before + self._unused[team]

    def idle_for(self, borrower: str) -> Resources:
        """What the other teams' quotas leave unused, less what is already borrowed."""
        return self.unused - self._unused.get(borrower, Resources()) - self.borrowed

    def within_idle(self) -> bool:
        return all(getattr(self.borrowed, n) <= getattr(self.unused, n) + 1e-9 for n in self._limited)


def _unused_by(own: Resources, quota: Quota) -> Resources:
    def left(limit: float | None, value: float) -> float:
        return 0 if limit is None else max(0, limit - value)

    return Resources(
        left(quota.cpus, own.cpus),
        int(left(quota.memory, own.memory)),
        int(left(quota.gpus, own.gpus)),
        int(left(quota.clusters, own.clusters)),
        int(left(quota.nodes, own.nodes)),
    )


def _machines(value: Resources) -> Resources:
    return Resources(cpus=value.cpus, memory=value.memory, gpus=value.gpus)


def _positive(value: Resources) -> Resources:
    return Resources(*(max(0, getattr(value, name)) for name in RESOURCES))


def share(usage: Resources, quota: Quota) -> float:
    """The dominant share: the largest fraction of any limited resource in use (0 without limits)."""
    fractions = [
        getattr(usage, name) / limit for name in RESOURCES if (limit := getattr(quota, name)) is not None and limit > 0
    ]
    return max(fractions, default=0.0)


def _limited(demand: Resources, quota: Quota) -> Resources:
    """The part of ``demand`` that ``quota`` limits (what borrowing must cover)."""
    return Resources(*(getattr(demand, n) if getattr(quota, n) is not None else 0 for n in RESOURCES))


def _fits(demand: Resources, room: Resources) -> bool:
    return all(getattr(demand, f.name) <= getattr(room, f.name) for f in fields(Resources) if getattr(demand, f.name))


def _amount(name: str, value: float) -> str:
    if name == "memory":
        return f"{value / 2**30:.1f}Gi"
    return f"{value:g}"
