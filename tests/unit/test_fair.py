"""The capped claim's pure parts (supervisor/store/fair.py) and the retry budget's arithmetic."""

from __future__ import annotations

import doctest
from collections import Counter

import pytest

from supervisor import model
from supervisor.model import ClaimLimits, RetryBudget
from supervisor.store import budget, fair
from supervisor.store.fair import Candidate, Running, Window, kind_groups, pick


@pytest.mark.parametrize("module", [fair, model, budget])
def test_doctests(module) -> None:
    result = doctest.testmod(module)
    assert result.failed == 0


def cand(i: int, tenant: str, kind: str = "k", priority: int = 0) -> Candidate:
    return Candidate(i, tenant, kind, priority, float(i))


def ids(taken) -> list[int]:
    return [c.id for c in taken]


def test_positions_count_what_each_tenant_already_runs() -> None:
    window = Window([cand(1, "a"), cand(2, "a"), cand(3, "b"), cand(4, "b")], ["a", "b"])
    assert ids(pick(window, Running(), ClaimLimits(max_inflight=9), 4)) == [1, 3, 2, 4]
    busy_a = Running(2, Counter(a=2))
    assert ids(pick(window, busy_a, ClaimLimits(max_inflight=9), 3)) == [3, 4, 1]


def test_round_robin_turn_breaks_ties_after_priority() -> None:
    window = Window([cand(1, "a"), cand(2, "b", priority=1), cand(3, "c")], ["c", "a", "b"])
    assert ids(pick(window, Running(), ClaimLimits(max_inflight=9), 3)) == [2, 3, 1]


def test_caps_bound_the_pick() -> None:
    window = Window(
        [cand(1, "a", "x"), cand(2, "a", "y"), cand(3, "b", "x"), cand(4, "c", "y")],
        ["a", "b", "c"],
    )
    limits = ClaimLimits(tenant_max_inflight=1, kind_max_inflight={"x": 1})
    assert ids(pick(window, Running(), limits, 9)) == [1, 4]
    assert ids(pick(window, Running(), ClaimLimits(max_inflight=2), 2)) == [1, 3]


def test_running_room_full_tenants_and_open_kinds() -> None:
    running = Running.of([("a", "x", 2), ("b", "x", 1), ("b", "y", 1)])
    assert running.total == 4
    limits = ClaimLimits(max_inflight=5, tenant_max_inflight=2, kind_max_inflight={"x": 3})
    assert running.room(limits, 10) == 1 and running.room(ClaimLimits(), 10) == 10
    assert running.full_tenants(limits) == ["a", "b"]
    assert running.open_kinds(limits, ["x", "y"]) == ["y"]


def test_kind_groups_read_each_capped_kind_alone() -> None:
    limits = ClaimLimits(kind_max_inflight={"x": 2, "z": 5})
    groups = kind_groups(Running(kinds=Counter(x=1)), limits, ["w", "x", "y", "z"], 4)
    assert groups == [(["w", "y"], 4), (["x"], 1), (["z"], 4)]


def test_next_cursor() -> None:
    window = Window([cand(1, "a"), cand(2, "b")], ["b", "c", "a"], full=True)
    assert window.next_cursor([cand(2, "b"), cand(1, "a")]) == "a"
    assert window.next_cursor([]) == "a"  # nothing served: after the (full) window
    assert Window([], ["b"], full=False).next_cursor([]) is None


@pytest.mark.parametrize(
    "now, bucket", [(0.0, 0), (9.99, 0), (10.0, 1), (1_800_000_005.0, 180_000_000)]
)
def test_buckets(now: float, bucket: int) -> None:
    assert budget.bucket_of(now) == bucket


def test_window_buckets() -> None:
    assert budget.window_buckets(300.0) == 30 and budget.window_buckets(1.0) == 1


def test_budget_defaults() -> None:
    b = RetryBudget(0.1)
    assert (b.floor, b.window) == (10, 300.0)


# ---- weights (fair.slot_key) ----


@pytest.mark.parametrize(
    "running, weight, keys",
    [
        (0, 1, [(1, 1), (2, 1), (3, 1)]),  # equal shares: the position running + r
        (2, 1, [(3, 1), (4, 1), (5, 1)]),
        (0, 3, [(1, 1), (1, 2), (1, 3), (2, 1)]),  # three slots a round
        (2, 3, [(1, 3), (2, 1), (2, 2)]),
        (0, 0.5, [(1, 1), (3, 1), (5, 1)]),  # a slot every other round
        (0, 1.5, [(1, 1), (1, 2), (2, 1), (3, 1), (3, 2), (4, 1)]),  # 3 slots in 2 rounds
        (0, 0.1, [(1, 1), (11, 1)]),  # float weights land on whole rounds
    ],
)
def test_slot_keys(running: int, weight: float, keys: list[tuple[int, int]]) -> None:
    assert [fair.slot_key(running, r, weight) for r in range(1, len(keys) + 1)] == keys


def shares(slots: int, weights: dict[str, float], cursor_first: str) -> Counter[str]:
    """Fill ``slots`` one claim of 1 at a time, as a pool whose jobs never end would."""
    tenants = sorted(weights)
    running: Counter[str] = Counter()
    limits = ClaimLimits(weights=weights)
    for _ in range(slots):
        window = Window(
            [cand(100 * i + r, t) for i, t in enumerate(tenants) for r in range(slots)],
            [cursor_first, *[t for t in tenants if t != cursor_first]],
        )
        (taken,) = pick(window, Running(sum(running.values()), Counter(running)), limits, 1)
        running[taken.tenant] += 1
    return running


@pytest.mark.parametrize(
    "slots, weights, expected",
    [
        (8, {"big": 3, "small": 1}, {"big": 6, "small": 2}),  # whole rounds: the weights
        (4, {"big": 3, "small": 1}, {"big": 3, "small": 1}),
        (2, {"big": 3, "small": 1}, {"big": 1, "small": 1}),  # a partial round: turn by turn
        (6, {"a": 1, "b": 2, "c": 3}, {"a": 1, "b": 2, "c": 3}),
        (12, {"a": 1, "b": 1}, {"a": 6, "b": 6}),
    ],
)
def test_weighted_shares_one_claim_at_a_time_or_all_at_once(
    slots: int, weights: dict[str, float], expected: dict[str, int]
) -> None:
    for first in weights:
        assert shares(slots, weights, first) == Counter(expected)
    # one claim of all the slots picks the same shares
    tenants = sorted(weights)
    window = Window(
        [cand(100 * i + r, t) for i, t in enumerate(tenants) for r in range(slots)], tenants
    )
    taken = pick(window, Running(), ClaimLimits(weights=weights), slots)
    assert Counter(c.tenant for c in taken) == Counter(expected)


def test_a_light_tenant_is_never_starved_by_a_heavy_one() -> None:
    """Two slots, weights 3 and 1: after the heavy tenant's job ends it holds one slot, the
    light one none; the light tenant's first job comes first (a ratio (R + r) / w would give
    the heavy tenant 2/3 against 1, every time)."""
    window = Window([cand(1, "big"), cand(2, "big"), cand(3, "small")], ["big", "small"])
    limits = ClaimLimits(weights={"big": 3})
    assert ids(pick(window, Running(1, Counter(big=1)), limits, 1)) == [3]


def test_an_idle_tenant_goes_before_any_tenant_that_runs_a_job() -> None:
    window = Window([cand(1, "heavy"), cand(2, "idle", priority=-5)], ["heavy", "idle"])
    limits = ClaimLimits(weights={"heavy": 100, "idle": 0.1})
    assert ids(pick(window, Running(1, Counter(heavy=1)), limits, 1)) == [2]
    # with nothing running, priority breaks the tie between first turns
    assert ids(pick(window, Running(), limits, 2)) == [1, 2]


def test_heads_decide_with_weights() -> None:
    window = Window([cand(1, "a"), cand(2, "b")], ["a", "b"])
    heavy = ClaimLimits(weights={"a": 3})
    # a's second row (turn 2 of round 1) comes before b's head once b runs a job: undecided
    assert not fair.heads_decide(
        window, Running(1, Counter(b=1)), heavy, ["k"], 2, window.candidates
    )
    assert fair.heads_decide(window, Running(), ClaimLimits(), ["k"], 2, window.candidates)
