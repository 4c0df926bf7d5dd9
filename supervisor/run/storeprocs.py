"""``StoreProcesses``: the fleet's store processes (``run/storelink.py``'s ``ProcessLink``s,
none with an inline link) as the loop sees them: when each needs the loop, its tick, its end.

Their messages are the links' own business; this only answers the loop's questions about the
processes. Owned by the main thread.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator

from supervisor.run.storelink import CALL_LIMIT, ProcessLink


class StoreProcesses:
    def __init__(self, links: list[ProcessLink]) -> None:
        self.links = links

    def __iter__(self) -> Iterator[ProcessLink]:
        return iter(self.links)

    def __bool__(self) -> bool:
        return bool(self.links)

    def due_at(self, now: float) -> float | None:
        """When the links need the loop: a store process to fork again, frames the kernel
        did not take yet, the bound on an unanswered call."""
        due: list[float] = []
        for process in self.links:
            if process.pid is None:
                due.append(process.respawn_at)
                continue
            since = process.waiting_since()
            if since is not None and not process.killed:  # killed: its reaping wakes the loop
                due.append(since + CALL_LIMIT)
            if process.outbox:
                due.append(now + 0.01)
        return min(due, default=None)

    def tick(self, now: float, child_cleanup: Callable[[], None]) -> None:
        for process in self.links:
            process.tick(now, child_cleanup)

    def owner_of(self, pid: int) -> ProcessLink | None:
        """The link whose store process ``pid`` is."""
        return next((p for p in self.links if p.pid == pid), None)

    def pids(self) -> set[int]:
        return {p.pid for p in self.links if p.pid is not None}

    def reap(self, now: float) -> None:
        """Reap store processes that exited (outside the loop, which reaps every child)."""
        for process in self.links:
            if process.pid is None:
                continue
            with contextlib.suppress(ChildProcessError):
                done, status = os.waitpid(process.pid, os.WNOHANG)
                if done:
                    process.exited(status, now)
