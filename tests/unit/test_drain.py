"""The drain's phases and the instant the loop must wake for them (run/drain.py)."""

from __future__ import annotations

from supervisor.run.drain import Drain, DrainPhase


def test_a_drain_wakes_the_loop_at_the_grace_period_s_end() -> None:
    drain = Drain(grace_period=30.0, write_patience=10.0)
    assert drain.due_at() is None  # not draining
    assert drain.on_signal(100.0) is DrainPhase.FINISHING
    assert drain.due_at() == 130.0
    assert drain.tick(101.0, busy=1, workers=1, pending_writes=0) is DrainPhase.FINISHING


def test_jobs_done_before_the_grace_s_end_with_writes_pending_wake_it_when_it_gives_up() -> None:
    # the writes stall: the drain gives up on them write_patience later, and the loop must
    # wake then, not at the grace period's end (later) nor at the next publish
    drain = Drain(grace_period=30.0, write_patience=10.0)
    drain.on_signal(100.0)
    assert drain.tick(102.0, busy=0, workers=0, pending_writes=3) is DrainPhase.FINISHING
    assert drain.due_at() == 112.0
    assert drain.tick(112.0, busy=0, workers=0, pending_writes=3) is DrainPhase.STOPPED
    assert drain.due_at() is None


def test_the_second_signal_kills_and_the_give_up_instant_stays_the_timer() -> None:
    drain = Drain(grace_period=30.0, write_patience=10.0)
    drain.on_signal(100.0)
    assert drain.on_signal(101.0) is DrainPhase.KILLING
    assert drain.due_at() is None  # the kills' exits wake it
    drain.tick(103.0, busy=0, workers=0, pending_writes=1)
    assert drain.due_at() == 113.0
    assert drain.tick(104.0, busy=0, workers=0, pending_writes=0) is DrainPhase.STOPPED
