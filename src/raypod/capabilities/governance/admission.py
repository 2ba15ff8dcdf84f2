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


@dataclass(frozen=True)
class Resources:
    cpus: float = 0.0
    memory: int = 0
    gpus: int = 0
    clusters: int = 0
    nodes: int = 0

    def __add__(self, other: Resources) -> Resources:
        return Resources(*(getattr(self, name) + getattr(other, name) for name in RESOURCES))

    def __sub__(self, other: Resources) -> Resources:
        return Resources(*(getattr(self, name) - getattr(other, name) for name in RESOURCES))


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
) -> Admission:
    """Decide the queue against what runs, ``quotas`` and ``pool`` (None: unlimited).

    Each team's workloads go in submission order: a team whose next workload does not fit its quota waits as a
    whole (none of its later workloads overtakes it). The cost is a heap operation per team and per admitted
    workload, whatever the queue's length. Positions in line come from ``order``.

    Preemption (the caller stops them gracefully, then they are queued again): borrowed workloads whose lenders
    now need their quota back, and, for the first workload the pool cannot hold, lower-priority workloads whose
    end makes room (borrowed ones first, then the lowest priority, newest first)."""
    current = list(running)
    used: dict[str, Resources] = {}
    lent: dict[str, Resources] = {}
    for run in current:
        team = run.workload.team
        used[team] = used.get(team, Resources()) + run.workload.demand
        if run.borrowed:
            lent[team] = lent.get(team, Resources()) + run.workload.demand
    lines = queue if isinstance(queue, WorkQueue) else WorkQueue(queue)
    total_used = sum(used.values(), Resources())
    idle: dict[str, Resources] = {}  # borrower -> what others leave idle; recomputed after each admission
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
            quota = quotas.get(team, UNLIMITED)
            own = used.get(team, Resources()) - lent.get(team, Resources())
            over = quota.over(own + item.demand)
            borrow = False
            if over and quota.borrow:
                if team not in idle:
                    if "" not in idle:
                        idle[""] = _unused(used, lent, quotas) - sum(lent.values(), Resources())
                    mine = _unused(used, lent, {team: quota}) if team in quotas else Resources()
                    idle[team] = idle[""] - mine
                if _fits(_limited(item.demand, quota), idle[team]):
                    over, borrow = [], True  # the whole workload runs on borrowed quota: the first to give it back
            if over:
                result.waiting[item.id] = f"team {team} is at its quota: " + ", ".join(over)
                continue  # the team waits as a whole
            total = total_used + item.demand
            if pool is not None and not _fits(_machines(total), pool):
                blocked = item
                short = [n for n in POOL_RESOURCES if getattr(total, n) > getattr(pool, n)]
                why = "the pool is full: " + ", ".join(
                    f"{n} {_amount(n, getattr(total, n))}/{_amount(n, getattr(pool, n))}" for n in short
                )
                victims = _make_room(item, current, _machines(total - pool), result.preempted, within_quota=not borrow)
                for victim in victims:
                    result.preempted[victim] = f"preempted for {item.id} (priority {item.priority})"
                result.waiting[item.id] = why + (f"; preempting {', '.join(victims)}" if victims else "")
                break
            result.admitted.append(item.id)
            admitted[item.id] = item
            idle.clear()
            total_used = total
            used[team] = used.get(team, Resources()) + item.demand
            if borrow:
                result.borrowed.append(item.id)
                lent[team] = lent.get(team, Resources()) + item.demand
            next_in_line[team] += 1
            if next_in_line[team] < len(members):
                heapq.heappush(heap, (share(used[team], quota), members[next_in_line[team]].submitted_at, team))
    for late in reversed(list(result.borrowed)):  # lenders admitted after a borrow in this pass come first
        if _within_idle(used, lent, quotas):
            break
        item = admitted.pop(late)
        result.admitted.remove(late)
        result.borrowed.remove(late)
        result.waiting[late] = "the quota it would borrow is needed by the team that lends it"
        used[item.team] = used[item.team] - item.demand
        lent[item.team] = lent[item.team] - item.demand
    for victim in _reclaim(current, used, lent, quotas, result.preempted):
        result.preempted[victim] = "its borrowed quota is needed back by the team that lent it"
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


def _reclaim(
    current: list[Running],
    used: Mapping[str, Resources],
    lent: Mapping[str, Resources],
    quotas: Mapping[str, Quota],
    taken: Mapping[str, str],
) -> list[str]:
    """Borrowed workloads to stop so what is borrowed fits again in what the lenders leave idle."""
    chosen: list[str] = []
    borrowed = sorted(
        (r for r in current if r.borrowed and r.workload.id not in taken),
        key=lambda r: (r.workload.priority, -r.workload.submitted_at),
    )
    remaining = {team: Resources() + amount for team, amount in lent.items()}
    still_used = {team: Resources() + amount for team, amount in used.items()}
    for run in borrowed:
        if _within_idle(still_used, remaining, quotas):
            break
        borrower = run.workload.team
        chosen.append(run.workload.id)
        remaining[borrower] = remaining[borrower] - run.workload.demand
        still_used[borrower] = still_used[borrower] - run.workload.demand
    return chosen


def _within_idle(used: Mapping[str, Resources], lent: Mapping[str, Resources], quotas: Mapping[str, Quota]) -> bool:
    """Whether everything borrowed still fits in the quota its lenders leave idle."""
    idle, borrowed = _unused(used, lent, quotas), sum(lent.values(), Resources())
    limited = [name for name in RESOURCES if any(getattr(q, name) is not None for q in quotas.values())]
    return all(getattr(borrowed, name) <= getattr(idle, name) + 1e-9 for name in limited)


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


def _idle(
    used: Mapping[str, Resources], lent: Mapping[str, Resources], quotas: Mapping[str, Quota], borrower: str
) -> Resources:
    """What other teams' quotas leave unused, less what borrowers already use of it (limited resources only)."""
    everyone = _unused(used, lent, quotas)
    own = _unused(used, lent, {borrower: quotas[borrower]}) if borrower in quotas else Resources()
    return everyone - own - sum(lent.values(), Resources())


def _unused(used: Mapping[str, Resources], lent: Mapping[str, Resources], quotas: Mapping[str, Quota]) -> Resources:
    """Quota the teams leave unused (their own usage only: borrowed work is not theirs to count)."""
    idle = dict.fromkeys(RESOURCES, 0.0)
    for team, quota in quotas.items():
        own = used.get(team, Resources()) - lent.get(team, Resources())
        for name in RESOURCES:
            limit = getattr(quota, name)
            if limit is not None:
                idle[name] += max(0.0, limit - getattr(own, name))
    return Resources(idle["cpus"], int(idle["memory"]), int(idle["gpus"]), int(idle["clusters"]), int(idle["nodes"]))


def _limited(demand: Resources, quota: Quota) -> Resources:
    """The part of ``demand`` that ``quota`` limits (what borrowing must cover)."""
    return Resources(*(getattr(demand, n) if getattr(quota, n) is not None else 0 for n in RESOURCES))


def _fits(demand: Resources, room: Resources) -> bool:
    return all(getattr(demand, f.name) <= getattr(room, f.name) for f in fields(Resources) if getattr(demand, f.name))


def _amount(name: str, value: float) -> str:
    if name == "memory":
        return f"{value / 2**30:.1f}Gi"
    return f"{value:g}"
