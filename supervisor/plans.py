"""Pure claim planning: whether a pool claims now, how many jobs, and whether the claim waits
armed in the store process. Values in, values out (tested with tables in
tests/unit/test_plans.py); the dispatcher gathers its pools' and workers' facts and acts
(supervisor/run/dispatch.py ``claim``).

A pool claims only with no claim in flight, unpaused, past its rate gate (its next token, said
by the last rated claim's reply), with a worker that could run what it claims (not all
stopping), while the store is not backing off, and when its adaptive poll is due (a wake-up
makes it due at once). A pool whose last claim found nothing does not wait for its poll: it
arms its claim in the store process, which runs it the moment a wake-up names the pool (or
when the poll is due), saving the pickup a round trip to the loop; not a pool under a
fleet-wide cap (it wakes on freed room in the loop), nor a rated one, nor during a drain, nor
on a link that cannot arm claims.

A pool claims for its workers' free room plus ``prefetch``. For a pool of short jobs that
pipelines (``depth`` > 1) room is what its workers may still be sent, and it claims
``AHEAD_PIPELINES`` times its capacity (what its workers' pipelines hold) ahead, but only
once half that capacity is missing: one claim then serves dozens of jobs instead of one
claim per finished job. A worker running a long job is left out by the caller (nothing goes
behind it).

Why that far ahead: a claim is a round trip through the store process, which may first be
writing results; on two loaded cores at ~24,000 no-op jobs a second its p90 was 4.8 ms, more
than one pipeline's 4 ms of work (policy.PIPELINE_BUDGET), so with one pipeline ahead the
workers ran dry while it was out (the host 15 % idle). Four pipelines ahead: more no-op jobs a
second on SQLite (docs/benchmarks.md, "Claiming further ahead"), each worker's share of the
buffer ~16 ms of short jobs (their leases held meanwhile, released at once by a drain). The
floor below is not multiplied: a shallow pipeline's jobs are the longer ones. A fair pool
(the default) decides its tenants' order at each claim, so a tenant that arrives waits
behind what is already claimed: those ~16 ms of short jobs a worker.

What a pipelining pool holds (queued in workers and buffered ahead) is at least
``HELD_AT_LEAST`` jobs, so a claim takes at least half that many: a claim's cost besides its
rows (its request to the store process, its statement, its commit: ~0.3 ms on SQLite) is then
shared by many jobs whatever the pipeline's depth. The depth falls when jobs take longer,
and on a busy host they do (a job of one Redis round trip took 0.75 ms on two loaded cores,
a depth of 5): claims of 5 jobs made the claims themselves most of the load. The jobs held
beyond the pipelines wait in the parent's buffer, never behind a running job, and go to the
first worker with room.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

HELD_AT_LEAST = 64  # jobs a pipelining pool holds, at least (claims of half that, or more)
AHEAD_PIPELINES = 4  # a pipelining pool's capacity claimed ahead of it (see above)


@dataclass(frozen=True, slots=True)
class Room:
    """One worker's share of a claim: jobs it may still be sent, and jobs it holds."""

    free: int
    held: int


def claim_size(rooms: Sequence[Room], *, depth: int, prefetch: int, buffered: int) -> int:
    """Jobs to claim now (0: none) for workers with ``rooms``, ``buffered`` already claimed.

    >>> claim_size([Room(1, 0), Room(1, 0)], depth=1, prefetch=0, buffered=0)
    2
    >>> claim_size([Room(0, 1), Room(0, 1)], depth=1, prefetch=1, buffered=0)
    1
    >>> claim_size([Room(60, 4), Room(64, 0)], depth=64, prefetch=0, buffered=0)
    636
    >>> claim_size([Room(10, 54), Room(10, 54)], depth=64, prefetch=0, buffered=500)
    0
    >>> claim_size([Room(5, 0), Room(5, 0)], depth=5, prefetch=0, buffered=0)  # HELD_AT_LEAST
    74
    >>> claim_size([Room(0, 1), Room(1, 0)], depth=36, prefetch=0, buffered=63)  # fed: wait
    0
    """
    taking = [r for r in rooms if r.free > 0 or r.held]
    pipelines = sum(r.free + r.held for r in taking)
    capacity = pipelines
    if depth > 1 and taking:  # a pipelining pool holds at least HELD_AT_LEAST (see above)
        capacity = max(capacity, HELD_AT_LEAST)
    room = sum(r.free for r in taking)
    # ahead: AHEAD_PIPELINES times what the pipelines hold (so a few of PIPELINE_BUDGET's
    # 4 ms of work a worker), not times the floor: a shallow pipeline's jobs take longer
    ahead = prefetch + (max(AHEAD_PIPELINES * pipelines, capacity) if depth > 1 else 0)
    want = room + ahead - buffered
    # one rule for busy and idle workers: a worker with nothing to do that the buffer cannot
    # feed means more than the capacity is missing, so it is claimed for at once; one the
    # buffer feeds waits like a busy one (exempting idle workers made a pool of fresh workers,
    # each booting empty, top its buffer up by one job per claim)
    if want <= 0 or not (depth == 1 or 2 * want >= capacity):
        return 0
    return want


class ClaimPlan(NamedTuple):
    """A claim to send: ``want`` jobs; ``arm``: it waits in the store process for a wake-up."""

    want: int
    arm: bool


def may_claim(*, in_flight: bool, paused: bool, now: float, rate_gate: float) -> bool:
    """Whether a pool may claim at all now (the cheap gates, before its rooms are gathered):
    none in flight, not paused (nothing of it starts), its rate's next token due.

    >>> may_claim(in_flight=False, paused=False, now=5.0, rate_gate=5.0)
    True
    >>> may_claim(in_flight=False, paused=False, now=5.0, rate_gate=5.5)
    False
    """
    return not in_flight and not paused and now >= rate_gate


def within_cap(rooms: list[Room], cap: int | None) -> list[Room]:
    """The rooms a claim may fill when at most ``cap`` workers may hold jobs (a pool that
    keeps a spare): every busy worker's, and idle ones' only up to the cap.

    >>> within_cap([Room(1, 0), Room(0, 1), Room(1, 0)], 2)
    [Room(free=0, held=1), Room(free=1, held=0)]
    """
    if cap is None:
        return rooms
    busy = [r for r in rooms if r.held]
    idle = [r for r in rooms if not r.held][: max(0, cap - len(busy))]
    return busy + idle


def claim_plan(
    rooms: list[Room],
    *,
    live: bool,
    booting: int,
    boot_failures: int,
    cap: int | None,
    depth: int,
    slots: int,
    prefetch: int,
    buffered: int,
    now: float,
    store_retry_at: float,
    next_poll_at: float,
    empty_claims: int,
    arms_claims: bool,
    capped: bool,
    rated: bool,
    draining: bool,
) -> ClaimPlan | None:
    """The claim a pool sends now, or None (for a pool ``may_claim`` let through).

    ``rooms``: its ready workers' (none behind a long job: nothing goes behind it); ``live``:
    a worker not stopping exists; ``booting`` workers are starting, each taking one job the
    moment it is Ready unless the pool's workers fail at boot (``boot_failures``); ``cap``:
    ``Pool.running_cap``; ``depth``: the pipeline's; a worker with ``slots`` runs what it is
    sent, so nothing is claimed ahead of its slots (a lease held idle). Then the store's
    backoff (``store_retry_at``) and the poll (``next_poll_at``; ``empty_claims``: claims in a
    row that found nothing) decide when, ``arms_claims`` (the link's), ``capped``, ``rated``
    and ``draining`` whether it may wait armed instead.
    """
    if not live:  # no worker could run what is claimed (none yet, or all stopping)
        return None
    if booting and boot_failures == 0:
        rooms = rooms + [Room(1, 0)] * booting
    rooms = within_cap(rooms, cap)
    ahead = 1 if slots > 1 else depth
    want = claim_size(rooms, depth=ahead, prefetch=prefetch, buffered=buffered)
    if not want or now < store_retry_at:
        return None
    if now >= next_poll_at:
        return ClaimPlan(want, False)
    arm = empty_claims > 0 and arms_claims and not capped and not rated and not draining
    return ClaimPlan(want, True) if arm else None
