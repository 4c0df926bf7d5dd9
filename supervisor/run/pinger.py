"""``Pinger``: asks idle workers whether they are alive, so a wedged idle worker is seen.

A busy worker proves it is alive by finishing (or is killed at its deadline); an idle one says
nothing at all, so a worker that was stopped (SIGSTOP), is stuck in the kernel or lost its
socket would sit there looking "idle" and take the next job into a black hole. Every pool's
``heartbeat`` each idle worker is sent a ``Ping``; its ``Pong`` (with the worker's RSS) clears
it. The worker reads frames in order, so the Pong comes before anything it does with a job sent
after the Ping: an unanswered Ping means a stuck worker whatever its state is now.

- Pong later than ``observer.ping_timeout``: health reports the worker wedged (503).
- Still no Pong after ``kill_after`` (the pool's lease, at least 10 s): the worker is killed
  (reason ``wedged``; a job it was handed meanwhile is released, not failed) and replaced.

Owned by the supervisor's main thread.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from supervisor.policy import KillKind, KillReason
from supervisor.run.workerproc import WorkerHandle, WorkerState
from workers import protocol

log = logging.getLogger("fleetd.pinger")


@dataclass
class _Outstanding:
    seq: int
    sent_at: float  # monotonic
    every: float  # the pool's ping period: the next Ping is due this long after the Pong


class Pinger:
    def __init__(self) -> None:
        self.seq = 0
        self.outstanding: dict[int, _Outstanding] = {}  # by worker pid
        self.next_ping: dict[int, float] = {}  # by worker pid (monotonic)

    def tick(self, pools: Iterable[Any], now: float) -> None:
        """Ping idle workers that are due; kill those silent for too long."""
        for pool in pools:
            every = pool.config.heartbeat
            kill_after = max(10.0, pool.config.lease)
            for worker in list(pool.workers.values()):
                waiting = self.outstanding.get(worker.pid)
                if waiting is not None:
                    if now - waiting.sent_at > kill_after and worker.kill_reason is None:
                        self._kill(worker, now - waiting.sent_at, now)
                    continue
                if worker.state != WorkerState.IDLE:
                    self.next_ping.pop(worker.pid, None)  # busy proves itself; ping once idle
                    continue
                # the first Ping soon (its Pong gives an idle worker's RSS), then every heartbeat
                due = self.next_ping.setdefault(worker.pid, now + min(every, 1.0))
                if now >= due:
                    self._ping(worker, now, every)

    def _ping(self, worker: WorkerHandle, now: float, every: float) -> None:
        self.seq += 1
        try:
            worker.send(protocol.Ping(self.seq), timeout=0.0)
        except (OSError, TimeoutError):
            return  # the worker is going away; its exit is handled on reap
        self.outstanding[worker.pid] = _Outstanding(self.seq, now, every)

    def _kill(self, worker: WorkerHandle, silent: float, now: float) -> None:
        detail = f"did not answer a ping for {silent:.0f}s; stopped and replaced"
        log.error("worker %s (pid %d): %s", worker.name, worker.pid, detail)
        worker.kill(KillReason(KillKind.WEDGED, detail), now)

    def on_messages(
        self, worker: WorkerHandle, messages: Sequence[protocol.Message], now: float
    ) -> None:
        """A Pong answers the outstanding Ping; the next one is due a heartbeat later."""
        waiting = self.outstanding.get(worker.pid)
        if waiting is None:
            return
        for msg in messages:
            if isinstance(msg, protocol.Pong) and msg.seq == waiting.seq:
                del self.outstanding[worker.pid]
                self.next_ping[worker.pid] = now + waiting.every
                return

    def waiting(self, pid: int, now: float) -> float | None:
        """Seconds the worker's Ping has gone unanswered, None when none is outstanding."""
        waiting = self.outstanding.get(pid)
        return None if waiting is None else now - waiting.sent_at

    def forget(self, pid: int) -> None:
        self.outstanding.pop(pid, None)
        self.next_ping.pop(pid, None)
