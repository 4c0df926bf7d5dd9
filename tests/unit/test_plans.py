"""Claim planning, pure: how many jobs a pool claims for its workers' room (supervisor/plans.py)."""

from __future__ import annotations

import doctest

import pytest

import supervisor.plans
from supervisor.plans import Room, claim_size


def test_doctests_pass() -> None:
    result = doctest.testmod(supervisor.plans)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize(
    ("rooms", "depth", "prefetch", "buffered", "want"),
    [
        # one job at a time: an idle worker each, plus prefetch, less what is buffered
        ([Room(1, 0), Room(0, 1)], 1, 0, 0, 1),
        ([Room(1, 0), Room(0, 1)], 1, 2, 0, 3),
        ([Room(1, 0), Room(0, 1)], 1, 2, 3, 0),
        ([Room(0, 1), Room(0, 1)], 1, 0, 0, 0),  # all busy, no prefetch: nothing
        ([], 1, 1, 0, 1),  # every worker behind a long job: prefetch alone
        # pipelining (depth 64): room plus four pipelines' worth ahead (AHEAD_PIPELINES)
        ([Room(64, 0), Room(64, 0)], 64, 0, 0, 640),
        # a worker with nothing to do always gets its share at once
        ([Room(64, 0), Room(4, 60)], 64, 0, 0, 580),
        # both busy, their buffer full but for 52: less than half a pipeline's worth, so wait
        ([Room(20, 44), Room(20, 44)], 64, 0, 500, 0),
        # ... until half of it is missing
        ([Room(40, 24), Room(40, 24)], 64, 0, 480, 112),
        # a shallow pipeline (depth 5) still holds HELD_AT_LEAST (64) jobs: room plus 64
        # ahead (the floor, not four times it: 4 x 10 is less)
        ([Room(5, 0), Room(5, 0)], 5, 0, 0, 74),
        ([Room(2, 3), Room(2, 3)], 5, 0, 50, 0),  # 18 missing: fewer than half of 64
        ([Room(3, 2), Room(3, 2)], 5, 0, 30, 40),  # 40 missing: one claim of 40
        # a deeper one past the floor: four times its pipelines ahead (4 x 20 = 80)
        ([Room(10, 0), Room(10, 0)], 10, 0, 0, 100),
        ([Room(1, 0), Room(0, 1)], 1, 0, 0, 1),  # one job at a time: no floor
        # fresh workers (one job each) of short jobs: a booted worker that the buffer feeds
        # waits for half of what is held to be missing, like a busy one
        ([Room(0, 1), Room(1, 0)], 36, 0, 63, 0),
        ([Room(0, 1), Room(1, 0), Room(1, 0)], 36, 0, 1, 65),  # two empty, one buffered: now
        ([Room(0, 1), Room(1, 0)], 36, 0, 33, 32),
    ],
)
def test_claim_size(rooms: list[Room], depth: int, prefetch: int, buffered: int, want: int) -> None:
    assert claim_size(rooms, depth=depth, prefetch=prefetch, buffered=buffered) == want
