"""Pure send planning: which buffered jobs go to which of a pool's workers now. Values in,
values out (tested with tables in tests/unit/test_sendplan.py); the dispatcher gathers each
worker's facts, encodes the frames and writes them (supervisor/run/dispatch.py ``assign``).

A worker has room for what it may still hold (its pipeline's ``depth``, or its slots). One
that still has work is topped up only once half that room is free (one write, one wake-up,
many jobs), and not at all behind a job that has run longer than ``QUEUE_BEHIND_AT_MOST``:
that job is not short, whatever the last ones were. Jobs go out in claim order, each to the
least loaded worker with room; behind a running job only while the worker's queued frames stay
under ``PIPELINE_BYTES``, so the socket always takes them without waiting (a worker with
nothing ahead takes a frame of any size). While a pool keeps a spare, no more than its target
hold jobs at once (``cap``).
"""

from __future__ import annotations

from collections.abc import Iterator

PIPELINE_BYTES = 64 * 1024  # frame bytes queued behind a worker's running job, at most
# nothing more is queued behind a job running longer than this: it is not a short one. Well
# above the pipeline's budget: on two cores a busy worker can go unscheduled for milliseconds
QUEUE_BEHIND_AT_MOST = 0.05
UNSENDABLE = -1  # in a plan: the job's frame is too large for any worker


def behind_long_job(slots: int, started: float, now: float) -> bool:
    """Whether a worker whose current job ``started`` then runs a long one (longer than
    ``QUEUE_BEHIND_AT_MOST``): nothing goes behind it. A worker with slots runs what it is
    sent: nothing waits behind.

    >>> behind_long_job(1, 10.0, 10.04), behind_long_job(1, 10.0, 10.06)
    (False, True)
    >>> behind_long_job(4, 10.0, 20.0)
    False
    """
    return slots == 1 and now - started > QUEUE_BEHIND_AT_MOST


def send_room(room: int, depth: int, slots: int, started: float | None, now: float) -> int:
    """Jobs a worker may be sent now: its ``room`` (``WorkerHandle.room``), but none while it
    still has work (its current job ``started``; None: it has none) and less than half of
    ``depth`` is free, or while it runs a long job. A free slot runs at once: no pipeline.

    >>> send_room(1, 1, 1, None, 5.0)  # idle
    1
    >>> send_room(31, 64, 1, 5.0, 5.0), send_room(32, 64, 1, 5.0, 5.0)  # half free: top up
    (0, 32)
    >>> send_room(40, 64, 1, 5.0, 5.1)  # behind a long job
    0
    >>> send_room(1, 4, 4, 5.0, 9.0)  # a slot
    1
    """
    if slots > 1 or started is None:
        return room
    if room * 2 < depth or now - started > QUEUE_BEHIND_AT_MOST:
        return 0
    return room


def send_plan(
    rooms: list[int],
    held: list[int],
    queued_bytes: list[int],
    cap: int | None,
    sizes: Iterator[int | None],
) -> list[int]:
    """Where the buffered jobs go, in claim order: for each job taken, the index of its worker
    (in the order of ``rooms``), or ``UNSENDABLE``; the jobs after the last one taken stay.

    Worker ``i`` may be sent ``rooms[i]`` jobs (``send_room``), holds ``held[i]`` and has
    ``queued_bytes[i]`` of frames queued behind its running job; at most ``cap`` workers hold
    jobs at once (None: all may). ``sizes`` yields each buffered job's frame size in claim
    order (None: too large to send) and is pulled only while a worker has room, so the caller
    encodes no job that stays. The lists are not changed.

    >>> send_plan([1, 1], [0, 0], [0, 0], None, iter([10, 10, 10]))
    [0, 1]
    >>> send_plan([3, 3], [1, 0], [100, 0], None, iter([10] * 6))  # least loaded first
    [1, 0, 1, 0, 1, 0]
    >>> send_plan([1, 1], [0, 0], [0, 0], 1, iter([10, 10]))  # a spare kept idle
    [0]
    >>> send_plan([2], [1], [0], None, iter([None, 10, PIPELINE_BYTES]))  # the last waits
    [-1, 0]
    """
    room, ahead, queued = list(rooms), list(held), list(queued_bytes)
    running = sum(1 for h in ahead if h)
    plan: list[int] = []
    size = 0  # the next job's frame size once pulled, until it is placed (0: not pulled)
    while True:
        pick = -1  # the least loaded worker with room (the first of equals)
        for i, r in enumerate(room):
            if r <= 0 or not (cap is None or ahead[i] or running < cap):
                continue
            if pick < 0 or ahead[i] < ahead[pick]:
                pick = i
        if pick < 0:
            return plan
        if not size:
            pulled = next(sizes, 0)
            if pulled == 0:  # no job left (a frame is never empty)
                return plan
            if pulled is None:
                plan.append(UNSENDABLE)
                continue
            size = pulled
        if ahead[pick] and queued[pick] + size > PIPELINE_BYTES:
            room[pick] = 0  # full for now
            continue
        if ahead[pick]:
            queued[pick] += size
        else:
            running += 1
        room[pick] -= 1
        ahead[pick] += 1
        plan.append(pick)
        size = 0
