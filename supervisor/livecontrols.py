"""What the keys of the interactive ``fleetd status`` do to the fleet: the same store verbs as
``fleetd pause``, ``resume``, ``cancel`` and ``dlq requeue|purge`` (so the same guards: a
cancel of a job that ended meanwhile changes nothing and says so), each answered by one line
for the status line, in the words of supervisor/actions.py. A store error is a line too
("could not pause pool bulk: ..."), never a crash of the view: during an incident the
database may be the thing that is failing.

``LiveControls`` is what supervisor/observe/terminal.py drives: ``view()`` and
``dead_letters()`` read, ``perform()`` writes.
"""

from __future__ import annotations

from collections.abc import Callable

from supervisor import actions
from supervisor.errors import FleetdError
from supervisor.model import JobFilter, JobState
from supervisor.observe.fleetview import FleetView
from supervisor.observe.liveview import (
    Action,
    Cancel,
    DeadRow,
    Pause,
    Purge,
    Reload,
    Requeue,
    Resume,
)
from supervisor.store import Store

DEAD = [JobState.DEAD]


class LiveControls:
    """The live view's reads and actions on one store (the status command's client's)."""

    def __init__(self, store: Store, read_view: Callable[[], FleetView]) -> None:
        self.store = store
        self._read_view = read_view

    def view(self) -> FleetView:
        """The fleet now (errors propagate: the driver keeps the last frame and says why)."""
        return self._read_view()

    def dead_letters(
        self, pool: str, only: str, limit: int, now: float
    ) -> tuple[int, tuple[DeadRow, ...]]:
        """How many dead letters ``pool`` has (of kind or tenant ``only``, when given), and
        the first ``limit`` of them by id, oldest first. ``now``: the view's database time."""
        if not only:
            count, found = self.store.find_jobs(JobFilter(pool=pool), DEAD, limit=limit)
        else:  # a kind or a tenant: the union of the two filters
            by_kind = self.store.find_jobs(JobFilter(pool=pool, kind=only), DEAD, limit=limit)
            by_tenant = self.store.find_jobs(JobFilter(pool=pool, tenant=only), DEAD, limit=limit)
            both, _ = self.store.find_jobs(
                JobFilter(pool=pool, kind=only, tenant=only), DEAD, limit=1
            )
            count = by_kind[0] + by_tenant[0] - both
            merged = {j.id: j for j in (*by_kind[1], *by_tenant[1])}
            found = [merged[i] for i in sorted(merged)[:limit]]
        return count, tuple(DeadRow.of(j, now) for j in found)

    def perform(self, action: Action) -> str:
        """Do ``action``; the line that says what it did (or why it could not)."""
        try:
            return self._do(action)
        except FleetdError as exc:
            return f"could not {_doing(action)}: {exc}"

    def _do(self, action: Action) -> str:
        match action:
            case Pause(pool):
                took = self.store.pause(pool)
                return actions.pause_key_line(pool, took, self._kind_pauses(pool))
            case Resume(pool):
                # only the pause p sets: kinds paused one by one (fleetd pause --kind) were
                # paused by someone for a reason of theirs, and stay paused, named in the line
                lifted = self.store.resume(pool, pool_wide_only=True)
                return actions.resume_key_line(pool, lifted, self._kind_pauses(pool))
            case Cancel(job):
                return actions.cancel_key_line(job, self.store.cancel([job]))
            case Requeue(job):
                lines = actions.dlq_lines("requeued", self.store.dlq_requeue([job]), None)
                return f"{lines[0]} — queued again, with a fresh delivery budget"
            case Purge(job):
                purged = self.store.dlq_purge([job])
                return actions.dlq_lines("purged", [job] if purged else [], None)[0]
            case Reload():
                return ""
        raise AssertionError(f"no such action: {action!r}")

    def _kind_pauses(self, pool: str) -> list[str]:
        """The kinds of ``pool`` paused one by one, now."""
        return [p.kind for p in self.store.pauses() if p.pool == pool and p.kind is not None]


def _doing(action: Action) -> str:
    match action:
        case Pause(pool):
            return f"pause pool {pool}"
        case Resume(pool):
            return f"resume pool {pool}"
        case Cancel(job):
            return f"cancel job {job}"
        case Requeue(job):
            return f"requeue dead job {job}"
        case Purge(job):
            return f"purge dead job {job}"
    return "read the fleet"
