"""Claim planning, pure: whether a pool claims now, how many, armed or not (supervisor/plans.py)."""

from __future__ import annotations

import doctest

import pytest

import supervisor.plans
from supervisor.plans import ClaimPlan, Room, claim_plan, claim_size, may_claim, within_cap


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


@pytest.mark.parametrize(
    ("in_flight", "paused", "now", "rate_gate", "may"),
    [
        (False, False, 5.0, 0.0, True),
        (True, False, 5.0, 0.0, False),  # one claim per pool in flight
        (False, True, 5.0, 0.0, False),  # paused: nothing of it starts
        (False, False, 5.0, 5.5, False),  # its rate's next token is not due yet
        (False, False, 5.5, 5.5, True),  # ... and now it is
    ],
)
def test_may_claim(in_flight: bool, paused: bool, now: float, rate_gate: float, may: bool) -> None:
    assert may_claim(in_flight=in_flight, paused=paused, now=now, rate_gate=rate_gate) is may


# a pool of one-job workers, its poll due, the store reachable: the plain case
PLAIN = {
    "live": True,
    "booting": 0,
    "boot_failures": 0,
    "cap": None,
    "depth": 1,
    "slots": 1,
    "prefetch": 0,
    "buffered": 0,
    "now": 100.0,
    "store_retry_at": 0.0,
    "next_poll_at": 0.0,
    "empty_claims": 0,
    "arms_claims": True,
    "capped": False,
    "rated": False,
    "draining": False,
}
IDLE2 = [Room(1, 0), Room(1, 0)]
QUIET = {"next_poll_at": 101.0, "empty_claims": 2}  # its poll not due; its last claims empty


@pytest.mark.parametrize(
    ("rooms", "facts", "plan"),
    [
        (IDLE2, {}, ClaimPlan(2, False)),
        (IDLE2, {"live": False}, None),  # every worker stopping: nobody could run a claim
        ([Room(0, 1)], {}, None),  # busy, no prefetch: nothing to claim
        ([Room(0, 1)], {"prefetch": 2}, ClaimPlan(2, False)),
        (IDLE2, {"buffered": 2}, None),  # the buffer feeds them
        # a booting worker takes a job the moment it is Ready, unless boots keep failing
        ([], {"booting": 2}, ClaimPlan(2, False)),
        ([], {"booting": 2, "boot_failures": 1}, None),
        # a spare kept: no more than the target (cap) hold jobs at once
        ([Room(0, 1), Room(1, 0), Room(1, 0)], {"cap": 2}, ClaimPlan(1, False)),
        ([Room(1, 0)], {"booting": 2, "cap": 2}, ClaimPlan(2, False)),
        # pipelining: room plus four pipelines' worth ahead; slots: nothing claimed ahead
        ([Room(4, 0), Room(4, 0)], {"depth": 4}, ClaimPlan(72, False)),
        ([Room(4, 0), Room(4, 0)], {"depth": 4, "slots": 4}, ClaimPlan(8, False)),
        (IDLE2, {"store_retry_at": 100.5}, None),  # the store is backing off
        (IDLE2, {"store_retry_at": 100.0}, ClaimPlan(2, False)),  # ... no longer
        (IDLE2, {"next_poll_at": 101.0}, None),  # its poll is not due (its last claim found work)
        (IDLE2, {"next_poll_at": 100.0}, ClaimPlan(2, False)),  # due now
        # its last claims found nothing: armed in the store process, for a wake-up
        (IDLE2, QUIET, ClaimPlan(2, True)),
        (IDLE2, QUIET | {"next_poll_at": 99.0}, ClaimPlan(2, False)),  # due: claimed now
        (IDLE2, QUIET | {"arms_claims": False}, None),  # the link cannot arm (InlineLink)
        (IDLE2, QUIET | {"capped": True}, None),  # wakes on freed room in the loop
        (IDLE2, QUIET | {"rated": True}, None),  # its tokens say when
        (IDLE2, QUIET | {"draining": True}, None),
        (IDLE2, QUIET | {"store_retry_at": 101.0}, None),  # backing off: not even armed
    ],
)
def test_claim_plan(rooms: list[Room], facts: dict, plan: ClaimPlan | None) -> None:
    assert claim_plan(rooms, **(PLAIN | facts)) == plan  # type: ignore[arg-type]


def test_claim_plan_does_not_change_the_rooms_it_is_given() -> None:
    rooms = [Room(0, 1)]
    claim_plan(rooms, **(PLAIN | {"booting": 2, "cap": 1}))  # type: ignore[arg-type]
    assert rooms == [Room(0, 1)]


@pytest.mark.parametrize(
    ("rooms", "cap", "kept"),
    [
        ([Room(1, 0), Room(1, 0)], None, [Room(1, 0), Room(1, 0)]),
        ([Room(1, 0), Room(0, 1), Room(2, 0)], 2, [Room(0, 1), Room(1, 0)]),  # busy first
        ([Room(0, 1), Room(0, 2), Room(1, 0)], 1, [Room(0, 1), Room(0, 2)]),  # over the cap
    ],
)
def test_within_cap(rooms: list[Room], cap: int | None, kept: list[Room]) -> None:
    assert within_cap(rooms, cap) == kept
