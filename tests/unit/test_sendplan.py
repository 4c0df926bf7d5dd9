"""Send planning, pure: which buffered job goes to which worker (supervisor/sendplan.py)."""

from __future__ import annotations

import doctest
from collections.abc import Iterator

import pytest

import supervisor.sendplan
from supervisor.clock import FakeClock
from supervisor.sendplan import (
    PIPELINE_BYTES,
    QUEUE_BEHIND_AT_MOST,
    UNSENDABLE,
    behind_long_job,
    send_plan,
    send_room,
)

X = UNSENDABLE
BIG = PIPELINE_BYTES // 2 + 1  # two of these do not fit behind a running job


def test_doctests_pass() -> None:
    result = doctest.testmod(supervisor.sendplan)
    assert result.attempted > 0 and result.failed == 0


def test_behind_long_job_on_a_fake_clock() -> None:
    clock = FakeClock()
    started = clock.monotonic()
    assert not behind_long_job(1, started, clock.monotonic())
    clock.advance(QUEUE_BEHIND_AT_MOST)
    assert not behind_long_job(1, started, clock.monotonic())  # not longer than it yet
    clock.advance(0.001)
    assert behind_long_job(1, started, clock.monotonic())
    assert not behind_long_job(2, started, clock.monotonic())  # slots: nothing waits behind


@pytest.mark.parametrize(
    ("room", "depth", "slots", "running_for", "sent"),
    [
        (1, 1, 1, None, 1),  # idle, one at a time
        (64, 64, 1, None, 64),  # idle, pipelining: all of it
        (0, 1, 1, 0.0, 0),  # busy, one at a time: no room
        (31, 64, 1, 0.01, 0),  # less than half its room free: not topped up yet
        (32, 64, 1, 0.01, 32),  # half: topped up
        (40, 64, 1, 0.06, 0),  # behind a long job: nothing
        (3, 4, 4, 10.0, 3),  # slots: a free slot runs at once, however long the others run
        (0, 4, 4, 0.0, 0),
    ],
)
def test_send_room(room: int, depth: int, slots: int, running_for: float | None, sent: int) -> None:
    now = 500.0
    started = None if running_for is None else now - running_for
    assert send_room(room, depth, slots, started, now) == sent


@pytest.mark.parametrize(
    ("rooms", "held", "queued", "cap", "sizes", "plan"),
    [
        ([1, 1], [0, 0], [0, 0], None, [10, 10, 10], [0, 1]),  # one each; the third stays
        ([0, 0], [1, 1], [0, 0], None, [10], []),  # no room anywhere
        ([2, 2], [0, 0], [0, 0], None, [], []),  # nothing buffered
        # the least loaded first (the first of equals), in claim order
        ([3, 3], [2, 0], [20, 0], None, [10] * 5, [1, 1, 0, 1, 0]),
        ([5, 5, 5], [0, 0, 0], [0, 0, 0], None, [10] * 4, [0, 1, 2, 0]),
        # a frame too large for any worker is placed nowhere, and the next job goes on
        ([1], [0], [0], None, [None, 10, 10], [X, 0]),
        ([0], [1], [0], None, [None], []),  # ... but only once a worker has room
        # behind a running job the queued bytes stay under PIPELINE_BYTES ...
        ([3], [1], [0], None, [BIG, BIG], [0]),
        ([3, 3], [1, 1], [0, 0], None, [BIG, BIG, BIG], [0, 1]),  # full: the next worker
        # ... but a worker with nothing ahead takes one of any size, then queues what fits
        ([3], [0], [0], None, [4 * PIPELINE_BYTES, BIG, BIG], [0, 0]),
        ([2], [1], [PIPELINE_BYTES - 10], None, [10, 1], [0]),  # exactly full
        # a spare kept: at most ``cap`` workers hold jobs; the busy ones are topped up
        ([1, 1, 1], [0, 0, 0], [0, 0, 0], 2, [10] * 3, [0, 1]),
        ([2, 1, 1], [1, 0, 0], [0, 0, 0], 1, [10] * 3, [0, 0]),
        ([1, 1], [0, 0], [0, 0], 0, [10], []),
    ],
)
def test_send_plan(
    rooms: list[int],
    held: list[int],
    queued: list[int],
    cap: int | None,
    sizes: list[int | None],
    plan: list[int],
) -> None:
    assert send_plan(rooms, held, queued, cap, iter(sizes)) == plan


def test_send_plan_pulls_no_size_it_cannot_place_and_changes_no_list() -> None:
    pulled: list[int] = []

    def sizes() -> Iterator[int | None]:
        for n in range(10):
            pulled.append(n)
            yield 10

    rooms, held, queued = [2, 1], [0, 0], [0, 0]
    assert send_plan(rooms, held, queued, None, sizes()) == [0, 1, 0]
    assert pulled == [0, 1, 2]  # the fourth job was never encoded: no worker had room
    assert (rooms, held, queued) == ([2, 1], [0, 0], [0, 0])


def test_send_plan_pulls_a_job_that_found_its_worker_full_once() -> None:
    # the first worker's pipeline is full for a big frame: the same job goes to the second
    pulled: list[int] = []

    def sizes() -> Iterator[int | None]:
        for size in (BIG, BIG):
            pulled.append(size)
            yield size

    assert send_plan([3, 3], [1, 2], [BIG, 0], None, sizes()) == [1]
    assert pulled == [BIG, BIG]  # the second stays: both pipelines are full for it
