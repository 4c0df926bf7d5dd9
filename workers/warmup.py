"""The forker's warm-up: ``prepare_forker``, run once after its imports so that each worker
forked from it starts with less to write (every page a fresh worker writes that it still
shares with the forker is a copy-on-write fault)."""

from __future__ import annotations

import contextlib
import gc
import json

from workers import context, limits, proctitle, protocol
from workers.outcome import call
from workers.signals import note_forkers_signals
from workers.spec import WorkerSpec
from workers.worker import Worker

REHEARSALS = 64  # runs of each path: past the interpreter's warm-up, which specialises code


def prepare_forker() -> None:
    """Make this process (the forker, once its handlers are imported) a cheaper one to fork
    workers from. A fresh worker pays for every page it writes that it still shares with
    the forker: a copy-on-write fault, ~2.7 µs here with a memory cgroup (measured), and
    a fresh worker took ~700 of them to run one no-op job. So, once, here:

    - note what a worker must undo of this process's signal setup (the handlers a handler
      module installed at import): it undoes that and no more (``workers.signals``). The
      forker keeps them (a library's SIGALRM timer goes on running its handler here), but
      for a wake-up fd, dropped here, and SIGINT/SIGTERM/SIGCHLD, which ``forker.serve``
      sets back;
    - the pure code every job runs (frames both ways, the title, JSON, the job context, a
      handler call) is run ``REHEARSALS`` times: the interpreter specialises a function's
      code in place on its first runs, and in a fresh worker every such write is a fault;
    - ``gc.freeze()``: what the forker holds is never walked by a collection here or there.

    What it cannot do: the handlers' own code warms up in each worker (only a job runs it);
    a handler the forker's own code installs later (a signal handler that installs another)
    is not seen, and its workers keep it."""
    note_forkers_signals()
    for _ in range(REHEARSALS):
        _rehearse(protocol.MAX_FRAME)
    with contextlib.suppress(OSError, AttributeError):  # no POSIX timers: said per worker
        limits.DeadlineAlarm.prepare()
    gc.collect()
    gc.freeze()


def _rehearse(max_frame: int) -> None:
    """One run of the pure paths a job takes through a worker (see ``prepare_forker``)."""
    run = protocol.RunJob(1, "kind", "{}", 1, 0.0, "token")
    frames = protocol.encode(run, max_frame) + protocol.encode(protocol.Ping(1), max_frame)
    protocol.FrameReader(max_frame).feed(frames)
    outcome = call(json.loads, run.payload)
    json.dumps(outcome.result, allow_nan=False)
    for reply in (
        protocol.Ready(1),
        protocol.JobDone(1, "null", 0.0, None),
        protocol.JobFailed(1, protocol.EXCEPTION, "", "", 0.0, None),
        protocol.Pong(1, None),
        protocol.Recycling(""),
    ):
        protocol.encode(reply, max_frame)
    proctitle.title_idle("pool", 1)
    proctitle.title_busy("pool", 1, 1, "kind", 0)
    context.unbind(context.bind(context.JobContext(1, "kind", 1, 0.0, "pool")))
    Worker(0, WorkerSpec(pool="pool", slot=1, handlers={}, parent_pid=0))  # its parts only
