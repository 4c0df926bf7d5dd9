"""Races between the loop and its forker (workers/forker.py) that a real loop hits only by
chance, driven step by step with an in-process fleet (tests/support/infleet.py) whose workers
a real forker forks: an exit relayed just before the forker died, the time between a worker's
end and the loop reading it, and a fork asked for when no descriptor is left."""

from __future__ import annotations

import json
import os
import select
import signal
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from supervisor.model import ErrorKind, JobState, NewJob
from supervisor.run.fleet import Fleet
from supervisor.run.forklink import ForkLink
from supervisor.store import Store
from tests.integration.fleet import handlers
from tests.support import infleet
from tests.support.wait import eventually
from workers import protocol

pytestmark = pytest.mark.slow


@pytest.fixture
def forked(tmp_path: Path) -> Iterator[tuple[Fleet, Store]]:
    made: list[Fleet] = []

    def make(**pool: object) -> tuple[Fleet, Store]:
        base = {"min_workers": 1, "max_workers": 1, "lease": "30s"}
        fleet, store = infleet.fleet_of(tmp_path, base | pool)
        infleet.real_forker(fleet)
        made.append(fleet)
        return fleet, store

    with infleet.subreaper():  # as the supervisor is: a dead forker's workers come to us
        yield make  # type: ignore[misc]
        for fleet in made:
            infleet.stop_all(fleet)


def job(kind: str, **payload: object) -> NewJob:
    return NewJob(kind, "p", json.dumps(payload), 1)


def relayed(forker: ForkLink | None) -> None:
    """Until the forker has written a record the loop did not read yet (an exit)."""
    assert forker is not None and forker.sock is not None
    ready, _, _ = select.select([forker.sock], [], [], 10.0)
    assert ready, "the forker relayed nothing"


def zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_crash_the_forker_relayed_before_it_died_stays_a_crash(forked) -> None:
    fleet, store = forked(handlers=handlers("segfault"), max_deliveries=1)
    pool, _ = infleet.one_worker(fleet, short_jobs=False)
    d = fleet.parts.dispatcher
    (crash,) = store.enqueue_many([job("segfault")])
    now = fleet.parts.clock.monotonic()
    d.claim(pool, now)
    d.assign(pool, now)
    forker = fleet.parts.forker
    assert isinstance(forker, ForkLink) and forker.pid is not None
    relayed(forker)  # the worker crashed and the forker said so; the loop has not read it
    os.kill(forker.pid, signal.SIGKILL)
    infleet.wait_exited(forker.pid)
    fleet.children.reap_children(
        fleet.parts.clock.monotonic()
    )  # finds the forker dead before its record
    d.flush(fleet.parts.clock.monotonic(), force=True)
    dead = store.get(crash)
    assert dead is not None and dead.state is JobState.DEAD, dead
    assert dead.error_kind is ErrorKind.CRASHED and dead.attempts == 1, dead


def test_a_workers_pid_stays_taken_until_the_loop_has_read_its_end(forked) -> None:
    # Until the loop has read that a worker ended, it may still signal that pid (a deadline,
    # a drain, a cancel): the pid must not be free for the kernel to give to another process
    fleet, _ = forked(handlers=handlers("noop"))
    pool, worker = infleet.one_worker(fleet)
    worker.send(protocol.Shutdown())
    relayed(fleet.parts.forker)
    assert zombie(worker.pid), "the worker's pid was freed before the loop read its end"
    assert fleet.parts.forker is not None
    fd = fleet.parts.forker.fileno()
    assert fd is not None
    fleet.parts.loop.watched[fd]()  # type: ignore[attr-defined]  # the selector's call: on_forker
    assert worker.pid not in pool.workers
    eventually(lambda: not zombie(worker.pid), timeout=10)  # and now the forker reaps it


@pytest.mark.parametrize("forker_alive", [True, False], ids=["forker", "forker-gone"])
def test_a_fork_with_no_descriptor_left_does_not_stop_the_loop(forked, forker_alive) -> None:
    # the supervisor is out of descriptors (EMFILE): the worker's socket, its cancel page or
    # a new forker's socket cannot be made. A pool that cannot fork now tries later.
    fleet, _ = forked(handlers=handlers("noop"))
    pool = fleet.parts.pools["p"]
    if not forker_alive:
        forker = fleet.parts.forker
        assert isinstance(forker, ForkLink) and forker.pid is not None
        os.kill(forker.pid, signal.SIGKILL)
        infleet.wait_exited(forker.pid)
        fleet.children.reap_children(fleet.parts.clock.monotonic())
        assert fleet.parts.forker is None
    now = fleet.parts.clock.monotonic() + 5.0  # any pause after the forker's death is over
    with infleet.no_descriptor_left():
        fleet.children.spawn(now)
    assert not pool.workers
    later = now + 60.0
    fleet.children.spawn(later)  # a new forker, if the last died: asked once it is ready
    assert fleet.parts.forker is not None
    fleet.parts.forker.await_ready(30.0)
    fleet.children.spawn(later)
    assert len(pool.workers) == 1


def test_a_forker_that_stops_answering_is_replaced_and_the_loop_goes_on(forked) -> None:
    fleet, _ = forked(handlers=handlers("noop"))
    pool = fleet.parts.pools["p"]
    old = fleet.parts.forker
    assert isinstance(old, ForkLink) and old.pid is not None
    stuck = old.pid
    os.kill(stuck, signal.SIGSTOP)  # alive, but it answers no request
    now = fleet.parts.clock.monotonic() + 5.0
    fleet.children.spawn(now)  # waits REPLY_LIMIT for the answer, then kills that forker
    assert fleet.parts.forker is None and not pool.workers
    with pytest.raises(ChildProcessError):  # killed, and reaped
        os.waitpid(stuck, os.WNOHANG)
    fleet.children.spawn(now + 60.0)  # a new forker; asked for the worker once it is ready
    assert isinstance(fleet.parts.forker, ForkLink) and fleet.parts.forker.pid != stuck
    assert not pool.workers
    fleet.parts.forker.await_ready(30.0)
    fleet.children.spawn(now + 60.0)
    assert len(pool.workers) == 1


def test_a_forker_that_never_becomes_ready_is_killed_at_its_boot_limit_and_backed_off(
    forked, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet, _ = forked(handlers={"modules": "tests.support.forker_handlers:modules"})
    first = fleet.parts.forker
    assert isinstance(first, ForkLink) and first.pid is not None
    os.kill(first.pid, signal.SIGKILL)
    infleet.wait_exited(first.pid)
    fleet.children.reap_children(fleet.parts.clock.monotonic())
    assert fleet.parts.forker is None
    # the next forkers' imports hang (this process imported the module already: not here)
    monkeypatch.setenv("FLEETD_TEST_SLOW_IMPORT", "60")
    fleet.children.forker_boot_limit = 1.0
    start = fleet.parts.clock.monotonic() + 5.0  # past the pause after the first one's death
    for broken, pause in ((1, 1.0), (2, 2.0)):  # 1, 2, 4 ... s from the start of the last
        fleet.children.spawn(start)
        hung = fleet.parts.forker
        assert isinstance(hung, ForkLink) and hung.pid is not None and not hung.ready
        hung_pid = hung.pid
        assert fleet.children.forker_due_at() == start + 1.0  # the loop wakes at the boot limit
        fleet.children.spawn(start + 0.5)  # booting: nothing asked of it, nothing killed
        assert fleet.parts.forker is hung and not fleet.parts.pools["p"].workers
        fleet.children.spawn(start + 1.0)
        assert fleet.parts.forker is None and hung.pid is None  # killed, and reaped
        with pytest.raises(ChildProcessError):
            os.waitpid(hung_pid, os.WNOHANG)
        assert fleet.children.forkers_broken == broken
        assert fleet.children.forker_due == max(start + 1.0, start + pause)
        start = fleet.children.forker_due
    fleet.children.spawn(start - 0.5)
    assert fleet.parts.forker is None  # not before its pause is over
