"""The loop's rule for its store calls' replies, on a real fleet: its own store processes on a
SQLite file, real workers. Each store verb the loop calls is made to fail in the store process
(``Hooks(wrap_store=)``, the links' seam): a bug (an exception that is not a StoreError)
reaches the loop's error policy, whichever call it was (the supervisor returns 70, every lease
handed back, attempts given back); an outage (StoreUnavailable) is backed off and the fleet
finishes its jobs. Before, a bug in a claim, an extend, the reaper or prune was backed off and
retried forever."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from supervisor.config import load_config
from supervisor.errors import StoreError, StoreRejected, StoreUnavailable
from supervisor.imports import import_handlers
from supervisor.model import JobState, NewJob
from supervisor.run.fleet import EXIT_LOOP_ERROR
from supervisor.store import Store, open_store
from tests.integration.fleet import handlers, write_config
from tests.support.wait import eventually

pytestmark = pytest.mark.slow

# the store verbs the loop's requests call (supervisor/run/requests.py), each reached within
# a second or two of a running fleet below
VERBS = [
    "claim_rows",  # ClaimRows, ArmedClaim: the plain pool's idle worker keeps polling
    "claim_rated",  # ClaimRated: the rated pool's
    "extend",  # Extend: every heartbeat of a running job
    "ack",  # WriteResults: a job done
    "reap",  # Reap
    "prune",  # Prune (every PRUNE_EVERY, made short here)
    "controls",  # ReadControls
    "node_heartbeat",  # NodeHeartbeat
    "schedule_states",  # SchedulePass
    "history",  # ScalerRead
    "arrivals",  # ObserverRead
]


class FailingVerb:
    """The store a store process runs requests against, one verb of it failing: once
    ``armed`` exists, its next ``times`` calls raise what ``error`` makes (each one noted in
    ``fired``). Every other verb is the store's own."""

    def __init__(
        self, store: Store, verb: str, error: Any, times: int, armed: Path, fired: Path
    ) -> None:
        self._store, self._verb, self._error = store, verb, error
        self._left, self._armed, self._fired = times, armed, fired

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._store, name)
        if name != self._verb:
            return real

        def failing(*args: Any, **kwargs: Any) -> Any:
            if self._left > 0 and self._armed.exists():
                self._left -= 1
                with self._fired.open("a") as out:
                    out.write(name + "\n")
                raise self._error(f"injected into {name}")
            return real(*args, **kwargs)

        return failing


def run_fleet(folder: Path, verb: str, error: Any, times: int) -> tuple[int, Store, Path]:
    """Fork a process that runs a Fleet (``fleetd start``'s, but for its store seam) on a
    fresh SQLite file; its pid, the test's store, and the file to create to arm the fault."""
    # two workers each, sleeping (io-bound: not held to the host's cores), so one is idle
    # and its pool keeps claiming while the other runs a long job
    two = {"min_workers": 2, "max_workers": 2, "bound": "io", "lease": "4s"}
    pools = {
        "plain": {**two, "handlers": KINDS},
        "rated": {
            **two,
            "rate_limit": "100/s",
            "handlers": {"rsleep": KINDS["sleep"], "rnoop": KINDS["noop"]},
        },
    }
    schedules = {"tick": {"kind": "noop", "every": "1s", "catch_up": "skip"}}
    path = write_config(folder, f"sqlite:///{folder}/q.db", pools, schedules, scale_interval="1s")
    config = load_config(path)
    store = open_store(config.database)
    armed, fired = folder / "armed", folder / "fired"
    pid = os.fork()
    if pid == 0:  # the supervisor
        code = 1
        try:
            from supervisor.run import housekeeping
            from supervisor.run.build import build_fleet
            from supervisor.run.hooks import Hooks

            housekeeping.PRUNE_EVERY = 0.5  # a prune every half second, not every minute
            boot = open_store(config.database)
            fleet = build_fleet(
                config,
                boot,
                import_handlers(config),
                node_id="bugs",
                hooks=Hooks(
                    wrap_store=lambda s: FailingVerb(s, verb, error, times, armed, fired)  # type: ignore[arg-type,return-value]
                ),
            )
            code = fleet.run()
        finally:
            os._exit(code)
    return pid, store, armed


KINDS = handlers("sleep", "noop")


def wait_exit(pid: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError(f"the supervisor did not exit within {timeout}s")


def end(pid: int) -> None:
    """Kill the supervisor if a failed assertion left it running (its store processes and
    workers die with it: PR_SET_PDEATHSIG)."""
    with contextlib.suppress(ProcessLookupError, ChildProcessError):
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def job(kind: str, pool: str, **payload: Any) -> NewJob:
    return NewJob(kind, pool, json.dumps(payload), 3)


@pytest.mark.parametrize("verb", VERBS)
def test_a_bug_in_a_store_call_stops_the_supervisor_and_hands_every_lease_back(
    tmp_path: Path, verb: str
) -> None:
    pid, store, armed = run_fleet(tmp_path, verb, TypeError, times=1)
    try:
        held = store.enqueue_many(
            [job("sleep", "plain", seconds=60), job("rsleep", "rated", seconds=60)]
        )
        eventually(lambda: all(store.get(i).state is JobState.LEASED for i in held), timeout=20)
        armed.touch()  # both running: the verb fails from now on, once
        if verb == "ack":
            store.enqueue_many([job("noop", "plain")])  # a result to write
        assert wait_exit(pid, 30) == EXIT_LOOP_ERROR
        assert (tmp_path / "fired").read_text().split() == [verb]
        jobs = [store.get(i) for i in held]
        assert [(j.state, j.attempts) for j in jobs] == [(JobState.QUEUED, 0)] * 2, jobs
        assert not [j for j in store.list_jobs(limit=1000) if j.state is JobState.LEASED]
    finally:
        end(pid)
        store.close()


@pytest.mark.parametrize("verb", VERBS)
def test_an_outage_of_a_store_call_is_backed_off_and_the_jobs_finish(
    tmp_path: Path, verb: str
) -> None:
    (tmp_path / "armed").touch()  # from the start
    pid, store, _ = run_fleet(tmp_path, verb, StoreUnavailable, times=3)
    try:
        ids = store.enqueue_many(
            [job("sleep", "plain", seconds=1.5), job("rsleep", "rated", seconds=1.5)]
            + [job("noop", "plain") for _ in range(5)]
            + [job("rnoop", "rated") for _ in range(5)]
        )
        eventually(lambda: all(store.get(i).state is JobState.DONE for i in ids), timeout=30)
        eventually(lambda: (tmp_path / "fired").exists(), timeout=10)
        os.kill(pid, signal.SIGTERM)
        assert wait_exit(pid, 30) == 0
    finally:
        end(pid)
        store.close()


@pytest.mark.parametrize(
    ("verb", "error"),
    [
        ("claim_rows", TypeError),  # both pools' claims and the disarm answer with bugs
        ("extend", TypeError),
        ("ack", TypeError),  # the releases of the same batch are written all the same
        ("claim_rows", StoreError),  # the database refusing a statement: not an outage
        ("controls", StoreRejected),
    ],
    ids=["claim-bug", "extend-bug", "ack-bug", "claim-refused", "controls-refused"],
)
def test_a_lasting_bug_still_ends_with_every_running_job_handed_back(
    tmp_path: Path, verb: str, error: Any
) -> None:
    """The verb fails at every call from then on, during the emergency stop too: the stop's
    releases are written whatever other reply is a bug, and it ends."""
    pid, store, armed = run_fleet(tmp_path, verb, error, times=10**6)
    try:
        held = store.enqueue_many(
            [job("sleep", "plain", seconds=60), job("rsleep", "rated", seconds=60)]
        )
        eventually(lambda: all(store.get(i).state is JobState.LEASED for i in held), timeout=20)
        armed.touch()
        if verb == "ack":
            store.enqueue_many([job("noop", "plain")])  # a result to write, never written
        assert wait_exit(pid, 40) == EXIT_LOOP_ERROR
        assert set((tmp_path / "fired").read_text().split()) == {verb}
        jobs = [store.get(i) for i in held]
        assert [(j.state, j.attempts) for j in jobs] == [(JobState.QUEUED, 0)] * 2, jobs
    finally:
        end(pid)
        store.close()
