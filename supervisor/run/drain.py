"""``Drain``: what SIGTERM and SIGINT mean, as explicit phases with monotonic deadlines.

    running ──signal──> finishing ──all jobs reported──────────────> stopped
                           │
                           └──grace_period over, or a second signal──> killing ──> stopped

- finishing: claim nothing more; release at once the jobs claimed but not started; idle
  workers stop; busy ones keep running with their leases still extended.
- killing: SIGKILL the busy workers; their jobs are released (visible at once, delivery not
  counted), not failed.
- stopped: every worker reaped and every result written (or, if the database stays unreachable
  for ``write_patience``, left to the reaper: the leases expire, nothing is lost).

The bound during a stall: grace_period + 10 s of write patience + the shutdown's closing of
the store processes (``run/stopping.py``, ``CLOSE_WITHIN``: 0.5 s for all of them) stays
within grace_period + 12 s.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class DrainPhase(StrEnum):
    RUNNING = "running"
    FINISHING = "finishing"
    KILLING = "killing"
    STOPPED = "stopped"


RUNNING, FINISHING, KILLING, STOPPED = DrainPhase


@dataclass
class Drain:
    grace_period: float
    write_patience: float = 10.0
    phase: DrainPhase = RUNNING
    deadline: float = 0.0  # end of the grace period (monotonic)
    give_up_writes_at: float = 0.0

    @property
    def active(self) -> bool:
        return self.phase != RUNNING

    def due_at(self) -> float | None:
        """The end of the grace period, while jobs may still finish; then the instant the
        drain gives up on its writes (the loop wakes for it, not a second later at the next
        publish)."""
        if self.phase == FINISHING:
            # the workers may all be done before the grace ends, the writes still pending
            return min(self.deadline, self.give_up_writes_at or self.deadline)
        if self.phase == KILLING and self.give_up_writes_at:
            return self.give_up_writes_at
        return None

    def on_signal(self, now: float) -> DrainPhase:
        """Advance on SIGTERM/SIGINT: the first starts the drain, the second skips the wait."""
        if self.phase == RUNNING:
            self.phase = FINISHING
            self.deadline = now + self.grace_period
        elif self.phase == FINISHING:
            self.phase = KILLING
        return self.phase

    def tick(self, now: float, busy: int, workers: int, pending_writes: int) -> DrainPhase:
        """The phase after this pass, given what is still running and unwritten."""
        if self.phase == FINISHING and now >= self.deadline:
            self.phase = KILLING
        if self.phase in (FINISHING, KILLING) and busy == 0 and workers == 0:
            if pending_writes == 0 or (self.give_up_writes_at and now >= self.give_up_writes_at):
                self.phase = STOPPED
            elif not self.give_up_writes_at:
                self.give_up_writes_at = now + self.write_patience
        return self.phase
