"""The worker's whole life after the fork: ``main(conn_fd, spec)``; it never returns.

::

    fork ─> setup (workers.startup) ───────────> Ready ─> loop (workers.worker; with slots,
            cgroup, signals (workers.signals),                 workers.slots)
            PDEATHSIG, privileges, rlimits,
            subreaper, title "fleetd: pool#slot idle"
    loop:  RunJob ─> the handler ─> JobDone | JobFailed ─> recycle? ─> Recycling ─> exit RECYCLE
           Ping ─> Pong   Shutdown ─> exit OK   Release ─> Returned (workers.conn)
           EOF / broken pipe ─> exit PARENT_GONE      bad frame ─> exit PROTOCOL_ERROR

The worker only knows its connection, its handler table and its limits (``WorkerSpec``,
workers/spec.py, importable from here too). Exits go through ``os._exit``: the worker is a
fork of the parent, and returning or unwinding into the parent's stack (its ``finally``
blocks, atexit hooks, buffered output) would run the parent's code twice. The forker's
warm-up before it forks workers is workers/warmup.py.
"""

from __future__ import annotations

import gc
import os
import traceback
from typing import NoReturn

from workers import context, exitcodes, protocol
from workers.exiting import WorkerExit, flush_stdio, say
from workers.spec import WorkerSpec
from workers.worker import Worker

__all__ = ["WorkerSpec", "main"]


def main(
    conn_fd: int, spec: WorkerSpec, cancel_slot: protocol.CancelSlot | None = None
) -> NoReturn:
    """Run a worker on ``conn_fd`` (a blocking, connected socket or pipe) until told to stop.

    Call it in the child right after ``os.fork()``, from the parent's main thread, after the
    parent flushed ``sys.stdout``/``sys.stderr`` and closed what the child must not keep.
    Always ends in ``os._exit`` with a code from ``workers.exitcodes``. ``cancel_slot``: where
    the parent writes the id of the job its ``CANCEL_SIGNAL`` is about (``protocol.CancelSlot``).
    """
    code = exitcodes.INTERNAL_ERROR
    # Every object inherited from the parent (its modules, the handlers, their data) goes to
    # the permanent generation: the cyclic GC never walks them, so a collection in the worker
    # does not write to their headers and copy their pages. Measured: a full collection in a
    # fresh worker made 21 MiB of the supervisor's pages private without this, none with it.
    # O(1) (list splices); cycles among inherited objects are never collected here (few).
    gc.freeze()
    try:
        context.use_cancel_slot(cancel_slot)
        if spec.threaded or spec.slots > 1:
            # imported here: only a worker with slots pays for asyncio and its threads
            from workers.slots import SlotWorker

            worker: Worker = SlotWorker(conn_fd, spec)
        else:
            worker = Worker(conn_fd, spec)
        worker.setup()
        worker.serve()
    except WorkerExit as stop:
        code = stop.code
        if stop.why:
            say(spec, stop.why)
    except BaseException:
        say(spec, "internal error", "ERROR", traceback.format_exc())
    finally:
        flush_stdio()
        os._exit(code)
