"""The admission logic, example by example and as properties (hypothesis): usage never exceeds a quota without
a recorded borrow, priority and first-come order hold, and equal priorities are never starved."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from raypod.capabilities.governance.admission import Quota, Resources, Running, Workload, admit, order

GiB = 2**30


def work(id_: str, team: str, cpus: float, *, priority: int = 100, at: float = 0.0) -> Workload:
    return Workload(id_, team, priority, at, Resources(cpus=cpus, memory=cpus * GiB, clusters=1, nodes=int(cpus)))


def test_within_quota_is_admitted_beyond_it_waits_with_the_reason() -> None:
    decided = admit([work("a1", "a", 4, at=1), work("a2", "a", 4, at=2)], [], {"a": Quota(cpus=6)}, None)
    assert decided.admitted == ["a1"]
    assert decided.waiting == {"a2": "team a is at its quota: cpus 8/6"}
    assert [w.id for w in order([work("a2", "a", 4, at=2), work("a1", "a", 4, at=1)], {}, {})] == ["a1", "a2"]


def test_priority_first_then_submission_time() -> None:
    queue = [work("low", "a", 2, priority=0, at=1), work("high", "a", 2, priority=1000, at=3), work("n", "a", 2, at=2)]
    assert [w.id for w in order(queue, {}, {})] == ["high", "n", "low"]
    decided = admit(queue, [], {}, Resources(cpus=4, memory=4 * GiB))
    assert decided.admitted == ["high", "n"]
    assert decided.waiting["low"].startswith("the pool is full: cpus 6/4")


def test_equal_priorities_share_fairly_between_teams() -> None:
    quotas = {"a": Quota(cpus=8), "b": Quota(cpus=8)}
    queue = [work("a1", "a", 2, at=1), work("a2", "a", 2, at=2), work("b1", "b", 2, at=3)]
    # a already uses half its quota: b, which uses none, goes before a's second workload
    assert [w.id for w in order(queue, {"a": Resources(cpus=2)}, quotas)] == ["b1", "a1", "a2"]


def test_a_workload_the_pool_cannot_hold_blocks_later_ones_but_a_quota_wait_blocks_nobody() -> None:
    pool = Resources(cpus=4, memory=64 * GiB)
    queue = [work("big", "a", 6, at=1), work("small", "b", 1, at=2)]
    decided = admit(queue, [], {}, pool)
    assert decided.admitted == [] and decided.why_waiting("small") == "behind big, which the pool cannot hold yet"
    queue = [work("over", "a", 2, at=1), work("small", "b", 1, at=2)]
    decided = admit(queue, [Running(work("a0", "a", 3))], {"a": Quota(cpus=3)}, Resources(cpus=16, memory=64 * GiB))
    assert decided.admitted == ["small"] and "quota" in decided.waiting["over"]


def test_borrowing_uses_other_teams_idle_quota_and_is_recorded() -> None:
    quotas = {"a": Quota(cpus=4, borrow=True), "b": Quota(cpus=8)}
    decided = admit([work("a1", "a", 4, at=1), work("a2", "a", 4, at=2)], [], quotas, None)
    assert decided.admitted == ["a1", "a2"] and decided.borrowed == ["a2"]
    no_borrow = {"a": Quota(cpus=4), "b": Quota(cpus=8)}
    assert admit([work("a1", "a", 4, at=1), work("a2", "a", 4, at=2)], [], no_borrow, None).borrowed == []
    busy = admit([work("a2", "a", 4)], [Running(work("a1", "a", 4)), Running(work("b1", "b", 6))], quotas, None)
    assert busy.admitted == [] and "quota" in busy.waiting["a2"], "b's idle 2 CPUs cannot hold 4"


def test_a_lender_gets_its_quota_back_by_preempting_the_borrower() -> None:
    quotas = {"a": Quota(cpus=4, borrow=True), "b": Quota(cpus=8)}
    running = [Running(work("a1", "a", 4)), Running(work("a2", "a", 4, at=1), borrowed=True)]
    decided = admit([work("b1", "b", 8, at=2)], running, quotas, None)
    assert decided.admitted == ["b1"]
    assert list(decided.preempted) == ["a2"] and "needed back" in decided.preempted["a2"]


def test_a_higher_priority_workload_preempts_lower_ones_to_make_room() -> None:
    pool = Resources(cpus=8, memory=64 * GiB)
    running = [
        Running(work("low-old", "a", 4, priority=0, at=1)),
        Running(work("low-new", "a", 4, priority=0, at=2)),
        Running(work("normal", "b", 2, priority=100, at=0)),
    ]
    decided = admit([work("urgent", "c", 4, priority=1000, at=3)], running, {}, Resources(cpus=10, memory=64 * GiB))
    assert decided.admitted == [] and list(decided.preempted) == ["low-new"]
    assert "preempting low-new" in decided.waiting["urgent"]
    assert admit([work("low", "c", 4, priority=0, at=3)], running, {}, pool).preempted == {}, "never for lower"


def test_a_namespace_quota_holds_back_its_namespace_only_and_in_order() -> None:
    def in_ns(id_: str, namespace: str, cpus: float, at: float) -> Workload:
        return Workload(id_, "a", 100, at, Resources(cpus=cpus), namespace=namespace)

    queue = [in_ns("dev1", "dev", 2, 1), in_ns("dev2", "dev", 2, 2), in_ns("prod1", "prod", 4, 3)]
    running = [Running(in_ns("dev0", "dev", 1, 0))]
    decided = admit(queue, running, {"a": Quota(cpus=10)}, None, {"dev": Quota(cpus=3)})
    assert decided.admitted == ["dev1", "prod1"]
    assert decided.waiting == {"dev2": "namespace dev is at its quota: cpus 5/3"}
    smaller_first = [in_ns("dev1", "dev", 4, 1), in_ns("dev2", "dev", 1, 2)]
    decided = admit(smaller_first, [], {}, None, {"dev": Quota(cpus=3)})
    assert decided.admitted == [] and decided.waiting["dev2"] == "behind namespace dev's earlier work"


workloads = st.lists(
    st.builds(
        work,
        st.uuids().map(str),
        st.sampled_from(["a", "b", "c"]),
        st.integers(1, 6).map(float),
        priority=st.sampled_from([0, 100, 1000]),
        at=st.floats(0, 100),
    ),
    max_size=25,
    unique_by=lambda w: w.id,
)
quota_sets = st.fixed_dictionaries(
    {team: st.builds(Quota, cpus=st.integers(4, 16).map(float), borrow=st.booleans()) for team in ["a", "b", "c"]}
)


@settings(max_examples=300, deadline=None)
@given(workloads, quota_sets)
def test_usage_never_exceeds_a_quota_without_a_recorded_borrow(queue: list[Workload], quotas: dict[str, Quota]) -> None:
    decided = admit(queue, [], quotas, None)
    by_id = {w.id: w for w in queue}
    for team, quota in quotas.items():
        own = sum(
            (by_id[i].demand for i in decided.admitted if by_id[i].team == team and i not in decided.borrowed),
            Resources(),
        )
        assert not quota.over(own), (team, own)
        if any(by_id[i].team == team for i in decided.borrowed):
            assert quota.borrow
    room = sum((Resources(cpus=q.cpus or 0) for q in quotas.values()), Resources())
    total = sum((by_id[i].demand for i in decided.admitted), Resources())
    assert total.cpus <= room.cpus + 1e-9, "borrowing lent more than the quotas hold"
    assert set(decided.admitted) <= set(by_id)


@settings(max_examples=200, deadline=None)
@given(workloads, st.integers(2, 10).map(float))
def test_a_namespace_never_exceeds_its_quota(queue: list[Workload], limit: float) -> None:
    queue = [Workload(w.id, w.team, w.priority, w.submitted_at, w.demand, namespace=w.team + "-ns") for w in queue]
    namespace_quotas = {"a-ns": Quota(cpus=limit)}
    decided = admit(queue, [], {"a": Quota(cpus=16, borrow=True)}, None, namespace_quotas)
    in_a = sum((w.demand for w in queue if w.id in decided.admitted and w.namespace == "a-ns"), Resources())
    assert in_a.cpus <= limit
    assert all(w.namespace == "a-ns" for w in queue if "namespace a-ns" in decided.why_waiting(w.id))


@settings(max_examples=100, deadline=None)
@given(workloads.filter(lambda q: len(q) > 0))
def test_equal_priorities_are_never_starved(queue: list[Workload]) -> None:
    """Every workload fits the pool alone and runs 3 rounds. With one priority, each round starts at least the
    first workload in the order once the pool empties, so all start within 3 rounds per workload: nobody waits
    forever behind later arrivals."""
    queue = [Workload(w.id, w.team, 100, w.submitted_at, w.demand) for w in queue]
    pool = Resources(cpus=8, memory=8 * GiB)
    quotas = {team: Quota(cpus=8) for team in ["a", "b", "c"]}
    waiting, running, started = list(queue), {}, {}
    bound = len(queue) * 3 + 3
    for round_ in range(int(bound) + 1):
        for id_ in [i for i, end in running.items() if end <= round_]:
            del running[id_]
        decided = admit(waiting, [Running(w) for w in queue if w.id in running], quotas, pool)
        for id_ in decided.admitted:
            running[id_], started[id_] = round_ + 3, round_
        waiting = [w for w in waiting if w.id not in decided.admitted]
        if not waiting:
            break
    assert not waiting, f"starved: {[w.id for w in waiting]}"
