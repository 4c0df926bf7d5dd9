"""The slot runtime (workers/slots.py) in real forked workers, driven over a socketpair like
the parent does: several jobs at once, each with its own result and ``current_job()``; async
handlers on one event loop, cancelled at their deadline; cancels flag only their job."""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

from tests.unit.test_workers_runtime import Worker
from workers import exitcodes, protocol
from workers.handlers import load_handlers
from workers.protocol import JobDone, JobFailed, Ping, Pong, Ready, Recycling, RunJob

KINDS = ["slot_sleep", "async_sleep", "async_stubborn", "slot_cancel_wait", "boom"]
SLOT_HANDLERS = load_handlers({k: f"tests.support.handlers:{k}" for k in KINDS})


def slot_worker(slots: int = 4, **spec: Any) -> Worker:
    worker = Worker(handlers=SLOT_HANDLERS, slots=slots, threaded=True, **spec)
    assert isinstance(worker.recv(), Ready)
    return worker


def send_job(w: Worker, job_id: int, kind: str, payload: Any, timeout: float = 60.0) -> None:
    body = json.dumps(payload)
    w.send(RunJob(job_id, kind, body, 1, time.time() + timeout, f"tok-{job_id}"))


def results(w: Worker, n: int, timeout: float = 10.0) -> dict[int, protocol.Message]:
    got: dict[int, protocol.Message] = {}
    while len(got) < n:
        msg = w.recv(timeout)
        if isinstance(msg, JobDone | JobFailed):
            got[msg.job_id] = msg
    return got


def reap(w: Worker, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid, status = os.waitpid(w.pid, os.WNOHANG)
        if pid:
            return status
        time.sleep(0.01)
    os.kill(w.pid, signal.SIGKILL)
    raise AssertionError("the worker did not exit")


def test_slots_run_at_once_each_with_its_own_job() -> None:
    w = slot_worker(slots=4)
    start = time.monotonic()
    for i in range(1, 5):
        send_job(w, i, "slot_sleep", {"seconds": 1.0})
    got = results(w, 4)
    took = time.monotonic() - start
    # four 1 s sleeps in one worker: at once, not one after another (which takes 4 s)
    assert took < 3.0, took
    for i, msg in got.items():
        assert isinstance(msg, JobDone)
        assert json.loads(msg.result) == {"pid": w.pid, "job": i, "attempt": 1}
    w.send(protocol.Shutdown())
    assert os.WEXITSTATUS(reap(w)) == exitcodes.OK


def test_a_ping_is_answered_while_every_slot_is_busy() -> None:
    w = slot_worker(slots=2)
    send_job(w, 1, "slot_sleep", {"seconds": 2.0})
    send_job(w, 2, "slot_sleep", {"seconds": 2.0})
    w.send(Ping(7))
    first = w.recv(1.5)
    assert isinstance(first, Pong) and first.seq == 7
    results(w, 2)
    os.kill(w.pid, signal.SIGKILL)
    reap(w)


def test_jobs_beyond_the_slots_wait_for_a_free_one() -> None:
    w = slot_worker(slots=2)
    for i in range(1, 4):
        send_job(w, i, "slot_sleep", {"seconds": 0.5})
    order = list(results(w, 3))
    assert order[-1] == 3  # the third started only once a slot was free
    os.kill(w.pid, signal.SIGKILL)
    reap(w)


def test_a_failure_in_one_slot_leaves_the_others() -> None:
    w = slot_worker(slots=3)
    send_job(w, 1, "slot_sleep", {"seconds": 0.3})
    send_job(w, 2, "boom", {})
    got = results(w, 2)
    assert isinstance(got[1], JobDone)
    assert isinstance(got[2], JobFailed) and got[2].error_kind == protocol.EXCEPTION
    os.kill(w.pid, signal.SIGKILL)
    reap(w)


def test_async_handlers_share_one_event_loop() -> None:
    w = slot_worker(slots=20)
    start = time.monotonic()
    for i in range(1, 21):
        send_job(w, i, "async_sleep", {"seconds": 1.0})
    got = results(w, 20)
    assert time.monotonic() - start < 4.0
    assert {json.loads(m.result)["job"] for m in got.values()} == set(range(1, 21))
    os.kill(w.pid, signal.SIGKILL)
    reap(w)


def test_an_async_handler_past_its_deadline_is_cancelled_and_the_worker_lives() -> None:
    w = slot_worker(slots=2)
    send_job(w, 1, "async_sleep", {"seconds": 30.0}, timeout=0.5)
    send_job(w, 2, "async_sleep", {"seconds": 0.2})
    got = results(w, 2)
    assert isinstance(got[2], JobDone)
    failed = got[1]
    assert isinstance(failed, JobFailed) and failed.error_kind == protocol.TIMEOUT
    assert "cancelled at the deadline" in failed.message
    send_job(w, 3, "async_sleep", {"seconds": 0.1})  # the worker goes on
    assert isinstance(results(w, 1)[3], JobDone)
    os.kill(w.pid, signal.SIGKILL)
    reap(w)


def test_a_cancel_flags_only_the_job_it_names() -> None:
    slot = protocol.CancelSlot()
    w = Worker(handlers=SLOT_HANDLERS, slots=3, threaded=True, cancel_slot=slot)
    assert isinstance(w.recv(), Ready)
    send_job(w, 1, "slot_cancel_wait", {"seconds": 3.0})
    send_job(w, 2, "slot_cancel_wait", {"seconds": 1.0})
    time.sleep(0.2)  # both started (a cancel signalled before the start counts as well)
    slot.write(1)
    os.kill(w.pid, protocol.CANCEL_SIGNAL)
    got = results(w, 2)
    assert json.loads(got[1].result) == {"stopped": True}
    assert json.loads(got[2].result) == {"stopped": False}
    os.kill(w.pid, signal.SIGKILL)
    reap(w)


def test_recycling_waits_for_the_running_slots() -> None:
    w = slot_worker(slots=3, max_jobs_per_worker=2)
    send_job(w, 1, "slot_sleep", {"seconds": 0.1})
    send_job(w, 2, "slot_sleep", {"seconds": 0.1})
    send_job(w, 3, "slot_sleep", {"seconds": 1.0})
    seen = []
    while True:
        try:
            msg = w.recv(5.0)
        except EOFError:
            break
        seen.append(msg)
    kinds = [type(m).__name__ for m in seen]
    assert "Recycling" in kinds
    done = {m.job_id for m in seen if isinstance(m, JobDone)}
    assert done == {1, 2, 3}  # the slot still running finished before the exit
    assert any(isinstance(m, Recycling) for m in seen)
    assert os.WEXITSTATUS(reap(w)) == exitcodes.RECYCLE


def test_a_job_queued_behind_a_hung_async_job_gets_its_whole_timeout() -> None:
    # a one-slot pool with an async handler pipelines: the second job is sent (its deadline
    # counted from the send) while the first runs. The first hangs and is cancelled at its
    # deadline; the second then starts and must get its own timeout from its start (the
    # parent's clock does the same), not be cancelled at once as overdue
    w = slot_worker(slots=1)
    send_job(w, 1, "async_sleep", {"seconds": 60}, timeout=1.0)
    send_job(w, 2, "async_sleep", {"seconds": 0.3}, timeout=1.0)
    got = results(w, 2, timeout=10)
    assert isinstance(got[1], JobFailed) and got[1].error_kind == protocol.TIMEOUT, got[1]
    assert isinstance(got[2], JobDone), got[2]
    os.kill(w.pid, signal.SIGKILL)
    reap(w)
