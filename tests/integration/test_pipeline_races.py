"""Races of a pipeline that a real loop hits only by chance, driven step by step with an
in-process fleet (tests/support/infleet.py: real workers, store and dispatcher; the test reads
the workers' frames and runs the loop's steps itself). Each race test lost or misblamed a job
before it was fixed; the last test pins when a result is written."""

from __future__ import annotations

import json
import select
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from supervisor.model import ErrorKind, JobState, NewJob
from supervisor.run.fleet import Fleet
from supervisor.run.outbox import ACK_WAIT
from supervisor.store import Store
from tests.integration.fleet import handlers
from tests.integration.test_leases import THIEF, steal
from tests.support import infleet
from tests.support.wait import eventually
from workers import protocol

pytestmark = pytest.mark.slow


@pytest.fixture
def hand(tmp_path: Path) -> Iterator[tuple[Fleet, Store, Path]]:
    made: list[Fleet] = []

    def make(**pool: object) -> tuple[Fleet, Store]:
        base = {"min_workers": 1, "max_workers": 1, "pipeline": 64, "lease": "30s"}
        fleet, store = infleet.fleet_of(tmp_path, base | pool)
        made.append(fleet)
        return fleet, store

    yield make  # type: ignore[misc]
    for fleet in made:
        infleet.stop_all(fleet)


def job(kind: str, **payload: object) -> NewJob:
    return NewJob(kind, "p", json.dumps(payload), 1)


def test_every_result_a_worker_wrote_before_it_exited_is_read(hand, tmp_path: Path) -> None:
    # 40 results of 3.5 KB: more than one read's worth is waiting when the worker recycles
    fleet, store = hand(handlers=handlers("sized"), max_jobs_per_worker=40)
    pool, worker = infleet.one_worker(fleet)
    ids = store.enqueue_many([job("sized", chars=3500) for _ in range(40)])
    now = fleet.parts.clock.monotonic()
    fleet.parts.dispatcher.claim(pool, now)
    fleet.parts.dispatcher.assign(pool, now)
    assert worker.held() == 40
    infleet.wait_exited(worker.pid)  # it ran all 40 and recycled; nothing read meanwhile
    fleet.children.reap_children(fleet.parts.clock.monotonic())
    fleet.parts.dispatcher.flush(fleet.parts.clock.monotonic(), force=True)
    assert [store.get(i).state for i in ids] == [JobState.DONE] * 40


def test_a_crash_is_a_crash_though_a_top_up_found_the_worker_gone(hand) -> None:
    fleet, store = hand(handlers=handlers("crash_exit", "noop"), max_deliveries=1)
    pool, worker = infleet.one_worker(fleet)
    d = fleet.parts.dispatcher
    (crash,) = store.enqueue_many([job("crash_exit", code=3)])
    now = fleet.parts.clock.monotonic()
    d.claim(pool, now)
    d.assign(pool, now)
    infleet.wait_exited(worker.pid)  # it crashed after this pass reaped children
    store.enqueue_many([job("noop")])
    d.wake(pool)
    now = fleet.parts.clock.monotonic()
    d.claim(pool, now)
    d.assign(pool, now)  # the top-up meets a closed socket
    fleet.children.reap_children(fleet.parts.clock.monotonic())  # the next pass
    d.flush(fleet.parts.clock.monotonic(), force=True)
    dead = store.get(crash)
    assert dead is not None and dead.state is JobState.DEAD, dead
    assert dead.error_kind is ErrorKind.CRASHED and dead.attempts == 1


def test_a_timeout_decided_for_one_job_is_not_blamed_on_the_next(hand) -> None:
    fleet, store = hand(handlers=handlers("sleep", "noop"), timeout="0.5s", max_deliveries=1)
    pool, worker = infleet.one_worker(fleet)
    d = fleet.parts.dispatcher
    a, b = store.enqueue_many([job("sleep", seconds=0.55), job("sleep", seconds=5)])
    now = fleet.parts.clock.monotonic()
    d.claim(pool, now)
    d.assign(pool, now)
    # A runs 0.55 s against a deadline 0.5 s after this assign: once its result is in the
    # socket (not read yet), the deadline has passed whenever the worker started it
    readable, _, _ = select.select([worker.fd], [], [], 10)
    assert readable, "job A's result never came"
    fleet.run_watchdog(fleet.parts.clock.monotonic())
    assert worker.kill_reason is not None and worker.kill_reason.kind == "timeout"
    infleet.wait_exited(worker.pid)
    fleet.children.reap_children(fleet.parts.clock.monotonic())  # reads A's result, then the exit
    d.flush(fleet.parts.clock.monotonic(), force=True)
    first, second = store.get(a), store.get(b)
    assert first is not None and first.state is JobState.DONE  # its result was in time to read
    assert second is not None and second.state is JobState.QUEUED and second.attempts == 0


def test_a_queued_job_whose_lease_is_taken_over_is_never_started(hand, tmp_path: Path) -> None:
    fleet, store = hand(handlers=handlers("sleep", "noop"))
    pool, worker = infleet.one_worker(fleet)
    d = fleet.parts.dispatcher
    log = str(tmp_path / "runs.jsonl")
    # three deliveries: the reap that lets the thief in must requeue it, not dead-letter it
    running, queued = store.enqueue_many(
        [
            NewJob("sleep", "p", json.dumps({"seconds": 5}), 3),
            NewJob("noop", "p", json.dumps({"log": log}), 3),
        ]
    )
    now = fleet.parts.clock.monotonic()
    d.claim(pool, now)
    d.assign(pool, now)
    assert worker.job is not None and [j.claimed.job_id for j in worker.queued] == [queued]
    stolen = steal(store, queued, "p", "noop")  # another node has it now
    d.heartbeat(pool, fleet.parts.clock.monotonic())  # the extension finds it lost
    assert worker.kill_reason is not None and worker.kill_reason.kind == "retire"
    infleet.wait_exited(worker.pid)
    fleet.children.reap_children(fleet.parts.clock.monotonic())
    d.flush(fleet.parts.clock.monotonic(), force=True)
    taken, first = store.get(queued), store.get(running)
    assert taken is not None and taken.owner == THIEF and taken.attempts == stolen.attempt
    assert not (tmp_path / "runs.jsonl").exists()  # it never ran here
    # the running job, still ours, went back uncounted when its worker was stopped
    assert first is not None and first.state is JobState.QUEUED and first.attempts == 0


def test_a_lone_result_is_written_at_once_one_with_jobs_running_waits_for_company(hand) -> None:
    fleet, store = hand(handlers=handlers("sleep", "noop"))
    pool, worker = infleet.one_worker(fleet)
    d = fleet.parts.dispatcher

    def result_read() -> float:
        ready, _, _ = select.select([worker.fd], [], [], 10)
        assert ready, "no result from the worker"
        fleet.children.read_worker(worker)
        return fleet.parts.clock.monotonic()

    (lone,) = store.enqueue_many([job("noop")])
    d.claim(pool, fleet.parts.clock.monotonic())
    d.assign(pool, fleet.parts.clock.monotonic())
    d.flush(result_read())  # nothing else runs: no result could join it
    assert store.get(lone).state is JobState.DONE

    quick, slow = store.enqueue_many([job("noop"), job("sleep", seconds=1)])
    d.wake(pool)
    d.claim(pool, fleet.parts.clock.monotonic())
    d.assign(pool, fleet.parts.clock.monotonic())
    assert worker.held() == 2
    now = result_read()
    assert worker.job is not None and worker.job.claimed.job_id == slow
    d.flush(now)  # the slow job runs: the quick one's ack waits for company
    assert store.get(quick).state is JobState.LEASED
    d.flush(now + ACK_WAIT)
    assert store.get(quick).state is JobState.DONE


def test_a_cancel_asked_back_from_a_queue_stops_the_job_once_it_started(hand) -> None:
    # the worker starts the queued job before the Release asking it back arrives: no Returned
    # comes, so the cancel stays open and a later read finds the job running and stops it
    fleet, store = hand(handlers=handlers("sleep", "until_cancelled"))
    pool, worker = infleet.one_worker(fleet)
    d = fleet.parts.dispatcher
    a, b = store.enqueue_many([job("sleep", seconds=0.2), job("until_cancelled", seconds=30)])
    now = fleet.parts.clock.monotonic()
    d.claim(pool, now)
    d.assign(pool, now)
    assert worker.job is not None and [j.claimed.job_id for j in worker.queued] == [b]
    store.cancel([b])
    # B runs (the title names it) while the parent, not having read A's result, holds it
    # as queued behind A
    process = psutil.Process(worker.pid)
    eventually(lambda: f"job={b}" in " ".join(process.cmdline()), timeout=10)
    fleet.parts.controls.tick(
        fleet.parts.clock.monotonic()
    )  # Release sent; the worker is busy with B
    assert not fleet.parts.controls.stopping
    assert select.select([worker.fd], [], [], 10)[0]
    fleet.children.read_worker(worker)  # A's result: B is the job it runs now
    assert worker.job is not None and worker.job.claimed.job_id == b
    fleet.parts.controls.wake()
    fleet.parts.controls.tick(
        fleet.parts.clock.monotonic()
    )  # the next read: B runs, so it is stopped
    assert worker.pid in fleet.parts.controls.stopping

    def ended() -> bool:
        if select.select([worker.fd], [], [], 0.05)[0]:
            fleet.children.read_worker(worker)
        d.flush(fleet.parts.clock.monotonic(), force=True)
        return store.get(b).state is JobState.CANCELLED

    eventually(ended, timeout=5)  # its handler saw cancel_requested and returned
    assert store.get(a).state is JobState.DONE


def test_a_late_cancel_signal_does_not_cancel_the_next_job_of_the_pipeline(hand) -> None:
    # the parent, not having read A's result, signals the cancel of A while the worker runs B
    fleet, store = hand(handlers=handlers("sleep", "until_cancelled"))
    pool, worker = infleet.one_worker(fleet)
    d = fleet.parts.dispatcher
    a, b = store.enqueue_many([job("sleep", seconds=0.2), job("until_cancelled", seconds=1)])
    now = fleet.parts.clock.monotonic()
    d.claim(pool, now)
    d.assign(pool, now)
    assert worker.job is not None and worker.job.claimed.job_id == a
    process = psutil.Process(worker.pid)
    eventually(lambda: f"job={b}" in " ".join(process.cmdline()), timeout=10)
    store.cancel([a])
    fleet.parts.controls.tick(fleet.parts.clock.monotonic())  # A runs as far as the parent knows
    assert worker.pid in fleet.parts.controls.stopping

    def ended() -> bool:
        if select.select([worker.fd], [], [], 0.05)[0]:
            fleet.children.read_worker(worker)
        fleet.parts.controls.tick(
            fleet.parts.clock.monotonic()
        )  # no SIGKILL: A is no longer running
        d.flush(fleet.parts.clock.monotonic(), force=True)
        return store.get(b).state is JobState.DONE

    eventually(ended, timeout=10)
    first, second = store.get(a), store.get(b)
    assert first is not None and first.state is JobState.CANCELLED  # its result crossed it
    assert second is not None and second.result == {"stopped": False}
    assert worker.kill_reason is None and not fleet.parts.controls.stopping


def test_a_job_too_large_to_send_is_dead_and_the_jobs_around_it_still_go_out(hand) -> None:
    # the send plan places each job by its frame's size: the one no worker could ever take
    # fails at once (permanent), and the jobs before and after it reach the worker in order
    fleet, store = hand(handlers=handlers("noop"))
    pool, worker = infleet.one_worker(fleet)
    d = fleet.parts.dispatcher
    huge = "x" * (protocol.MAX_FRAME + 1)
    first, big, last = store.enqueue_many([job("noop"), job("noop", pad=huge), job("noop")])
    d.claim(pool, fleet.parts.clock.monotonic())  # its reply (inline) hands the jobs out at once
    assert [j.claimed.job_id for j in worker.jobs()] == [first, last]
    assert not d.buffer["p"]
    d.flush(fleet.parts.clock.monotonic(), force=True)
    dead = store.get(big)
    assert dead is not None and dead.state is JobState.DEAD, dead
    assert dead.error_kind is ErrorKind.PERMANENT
    assert (dead.last_error or "").startswith("cannot be sent: RunJob frame of "), dead.last_error
