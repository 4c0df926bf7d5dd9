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
