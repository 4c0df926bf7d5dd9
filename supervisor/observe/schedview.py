"""Schedules as ``fleetd schedules`` and ``fleetd status`` show them: pure, from the config's
schedules and the schedule rows (``Store.schedule_states``) read at the store's ``now``.

A schedule's ``status``:

- ``error``: a running supervisor's passes do not enqueue it (the database refuses its write,
  or the pass itself fails), from the supervisors' snapshots (``with_errors``);
- ``ok``: its ticks are decided on time, and the last tick's job did not die;
- ``stuck``: the last tick's job is still queued past the next tick (nothing runs its pool,
  or it waits for a retry): with ``overlap = "skip"`` no later tick is enqueued meanwhile;
- ``failed``: the last tick's job is dead (the next tick still comes);
- ``late``: a due tick has waited past its grace (and ``schedules.LATE_AFTER``) with no
  pass deciding it: no running supervisor has this schedule in its config (all stopped, or a
  rolling deploy that removed it), or their passes fail or are held up;
- ``waiting``: configured here, but no supervisor has run it yet (no row);
- ``unconfigured``: a row in the database that this config does not name (removed, or
  another host's config): nothing here enqueues it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from supervisor.model import JobState, ScheduleState, iso
from supervisor.schedules import ScheduleSpec, lateness, stuck_for

PROBLEMS = ("error", "late", "stuck", "failed")


@dataclass(frozen=True, slots=True)
class ScheduleSummary:
    name: str
    status: str  # ok, error, late, stuck, failed, waiting, unconfigured
    kind: str = ""
    timing: str = ""
    policies: str = ""
    last_tick: float | None = None
    last_job: int | None = None
    last_state: str | None = None  # None: no tick yet, or its job row is gone (pruned)
    last_success_at: float | None = None
    next_ticks: tuple[float, ...] = ()
    late_for: float = 0.0
    stuck_for: float = 0.0  # the last tick's job queued this long past the next tick
    missed: int = 0  # ticks never enqueued (catch_up, overlap), fleet-wide
    created_at: float | None = None
    error: str | None = None  # why a running supervisor does not enqueue it (its node named)

    @property
    def problem(self) -> bool:
        return self.status in PROBLEMS

    def detail(self) -> str:
        """One short line, most important first: what is wrong, or when it last ran."""
        when = (iso(self.last_tick) or "")[:19]
        last = "no tick yet" if self.last_tick is None else f"last tick {when} job {self.last_job}"
        if self.status == "error":
            return f"not enqueued: {self.error}; {last}"
        if self.status == "late":
            return (
                f"{self.late_for:.0f}s late: no pass decided its due tick (no running "
                f"supervisor has it, or their passes fail or are held up); {last}"
            )
        if self.status == "stuck":
            held = (
                "no later tick is enqueued until it runs (overlap skip)"
                if "overlap skip" in self.policies
                else "later ticks queue behind it"
            )
            queued = f"its last job is still queued {self.stuck_for:.0f}s past the next tick"
            return f"{queued}: {held}; {last}"
        if self.status == "failed":
            return f"its last job died: {last} dead"
        if self.status == "unconfigured":
            return f"not in this config; {last}"
        return f"{last} {self.last_state or 'gone'}" if self.last_tick is not None else last

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "kind": self.kind,
            "timing": self.timing,
            "policies": self.policies,
            "last_tick": iso(self.last_tick),
            "last_job": self.last_job,
            "last_state": self.last_state,
            "last_success_at": iso(self.last_success_at),
            "next_ticks": [iso(t) for t in self.next_ticks],
            "late_for": round(self.late_for, 3),
            "stuck_for": round(self.stuck_for, 3),
            "missed": self.missed,
            "created_at": iso(self.created_at),
            "error": self.error,
        }


def summarize(
    specs: Sequence[ScheduleSpec], states: Mapping[str, ScheduleState], now: float, ahead: int = 1
) -> tuple[ScheduleSummary, ...]:
    """Every configured schedule (in the config's order), then the rows no spec names; with
    the next ``ahead`` ticks after ``now``."""
    out = [_summary(s, states.get(s.name), now, ahead) for s in specs]
    named = {s.name for s in specs}
    out += [_summary(None, st, now, 0) for name, st in sorted(states.items()) if name not in named]
    return tuple(out)


def with_errors(
    found: Sequence[ScheduleSummary], errors: Mapping[str, Mapping[str, str]]
) -> tuple[ScheduleSummary, ...]:
    """``found`` with the errors running supervisors report (node id -> schedule -> why,
    from their snapshots): such a schedule's status is ``error``, naming the node."""
    out = []
    for s in found:
        nodes = sorted(node for node, mine in errors.items() if s.name in mine)
        if nodes:
            more = f" and {len(nodes) - 1} more node(s)" if len(nodes) > 1 else ""
            s = replace(
                s, status="error", error=f"{errors[nodes[0]][s.name]} (node {nodes[0]}{more})"
            )
        out.append(s)
    return tuple(out)


def _summary(
    spec: ScheduleSpec | None, state: ScheduleState | None, now: float, ahead: int
) -> ScheduleSummary:
    last = state.last if state else None
    late = lateness(spec, state, now) if spec is not None else 0.0
    stuck = stuck_for(spec, state, now) if spec is not None else 0.0
    if spec is None:
        status = "unconfigured"
    elif state is None:
        status = "waiting"
    elif late > 0:
        status = "late"
    elif stuck > 0:
        status = "stuck"
    elif last is not None and last.state == JobState.DEAD:
        status = "failed"
    else:
        status = "ok"
    return ScheduleSummary(
        name=spec.name if spec else state.name if state else "?",
        status=status,
        kind=spec.kind if spec else "",
        timing=spec.timing.describe() if spec else "",
        policies=spec.policies() if spec else "",
        last_tick=last.tick if last else None,
        last_job=last.job_id if last else None,
        last_state=str(last.state) if last and last.state else None,
        last_success_at=state.latest_success() if state else None,
        next_ticks=spec.timing.next_ticks(now, ahead) if spec else (),
        late_for=late,
        stuck_for=stuck,
        missed=state.missed if state else 0,
        created_at=state.created_at if state else None,
    )
