"""An in-process ``Fleet`` whose loop steps a test calls by hand, for races a real loop only
hits by chance (a worker exiting between two steps of one pass, results left unread while a
kill is decided). Everything else is real: the dispatcher, the store (a SQLite file), forked
workers running ``workers.runtime``; store calls run inline (``InlineLink``: each call is
answered before ``submit`` returns, so a claim fills the buffer at once). Only the selector
is replaced: ``HandLoop`` records what
the fleet watches, and the test decides when a worker's frames are read. And the forker's part
is done here (``InlineForker``): the workers are this process's children, reaped by
``Children.reap_children`` (the path a dead forker's workers take), so a test can hold a worker's
exit unreaped (``wait_exited``) between two steps. ``real_forker`` gives a fleet a real forker
instead, for the races between the loop and it (tests/integration/test_forker_races.py)."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import resource
import select
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from supervisor.config import load_config
from supervisor.imports import handler_refs, import_handlers
from supervisor.run.build import build_fleet
from supervisor.run.fleet import Fleet
from supervisor.run.forklink import ForkLink, start_forker
from supervisor.run.pool import Pool
from supervisor.run.storelink import InlineLink
from supervisor.run.workerproc import WorkerHandle, fork_worker
from supervisor.store import Store, open_store
from tests.integration.fleet import write_config
from workers.spec import WorkerSpec


class HandLoop:
    """What ``Fleet`` asks of its loop, without a selector: the test reads workers itself."""

    def __init__(self) -> None:
        self.watched: dict[int, Callable[[], None]] = {}

    def watch(self, fd: int, callback: Callable[[], None]) -> None:
        self.watched[fd] = callback

    def unwatch(self, fd: int) -> None:
        self.watched.pop(fd, None)

    def reset_in_child(self) -> None:
        pass

    def close(self) -> None:
        pass


class InlineForker:
    """``ForkLink``'s face (supervisor/run/forklink.py), forking in this process."""

    pid = None
    started_at = 0.0
    gone = False

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.exits: list[tuple[int, int]] = []  # never any: the fleet reaps its own children

    def fileno(self) -> None:
        return None

    def fork_worker(
        self, spec: WorkerSpec, *, now: float, cgroup_fd: int | None = None
    ) -> WorkerHandle:
        spec = dataclasses.replace(spec, cgroup_fd=cgroup_fd)
        return fork_worker(spec, now=now, child_cleanup=self.fleet.parts.child_cleanup)

    def take_exits(self) -> list[tuple[int, int]]:
        return []

    def reaped(self, pid: int) -> None:
        pass

    def close_socket(self) -> None:
        pass

    def close(self, timeout: float) -> None:
        return None

    def wait(self, timeout: float) -> None:
        return None


def inline_forks(fleet: Fleet) -> Fleet:
    """``fleet`` with its workers forked in this process (``InlineForker``)."""
    fleet.parts.forker = InlineForker(fleet)  # type: ignore[assignment]
    return fleet


def real_forker(fleet: Fleet) -> Fleet:
    """``fleet`` with a real forker (workers/forker.py), started from this process: its
    workers are the forker's children, their exits relayed as in ``fleetd start``."""
    fleet.parts.forker = start_forker(fleet.parts.handlers, handler_refs(fleet.parts.config))
    fleet.parts.forker.await_ready(30.0)  # as fleetd start does before the loop
    fleet.children.watch_forker()
    return fleet


PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 36, 37


@contextlib.contextmanager
def subreaper() -> Iterator[None]:
    """This process is a child subreaper meanwhile (as the supervisor is), then as before."""
    libc = ctypes.CDLL(None, use_errno=True)
    was = ctypes.c_int(0)
    libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(was), 0, 0, 0)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    try:
        yield
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, was.value, 0, 0, 0)


@contextlib.contextmanager
def no_descriptor_left() -> Iterator[None]:
    """Meanwhile this process can open no new descriptor (EMFILE): its soft RLIMIT_NOFILE is
    its lowest free descriptor."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowest = os.dup(0)
    os.close(lowest)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def fleet_of(folder: Path, pool: dict[str, Any]) -> tuple[Fleet, Store]:
    """A fleet with one pool ``p`` on a fresh SQLite file; nothing forked yet."""
    config = load_config(write_config(folder, f"sqlite:///{folder}/q.db", {"p": pool}))
    store = open_store(config.database)
    handlers = import_handlers(config)
    fleet = build_fleet(
        config, store, handlers, node_id="hand", link=InlineLink(store, time.monotonic)
    )
    fleet.parts.loop = HandLoop()  # type: ignore[assignment]
    inline_forks(fleet)
    return fleet, store


def one_worker(fleet: Fleet, *, short_jobs: bool = True) -> tuple[Pool, WorkerHandle]:
    """Fork the pool's one worker and wait for its Ready. ``short_jobs``: the pool has
    measured its jobs as sub-millisecond, so it pipelines."""
    pool = fleet.parts.pools["p"]
    if short_jobs:
        pool.recent_duration = 0.0
    fleet.children.fork(pool, fleet.parts.clock.monotonic())
    (worker,) = pool.workers.values()
    deadline = time.monotonic() + 10
    while worker.state == "starting":
        ready, _, _ = select.select([worker.fd], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, "the worker did not say Ready"
        fleet.children.read_worker(worker)
    return pool, worker


def wait_exited(pid: int, timeout: float = 10.0) -> None:
    """Until the child has exited, without reaping it (the fleet's reap does that)."""
    deadline = time.monotonic() + timeout
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"worker {pid} still running")
        time.sleep(0.005)


def stop_all(fleet: Fleet) -> None:
    """Kill and reap every worker, and remove the memory cgroups a booted fleet made (they
    are shared by every fleet of this test process: one left behind fails a later test)."""
    for pool in fleet.parts.pools.values():
        for worker in list(pool.workers.values()):
            try:
                os.kill(worker.pid, 9)
                os.waitpid(worker.pid, 0)
            except (OSError, ChildProcessError):
                pass
    if isinstance(fleet.parts.forker, ForkLink):
        fleet.parts.forker.close(1.0)
    fleet.parts.memcg.close()
