"""``Scheduler``: the loop's side of schedules. It asks for a pass (``SchedulePass``,
supervisor/run/schedulepass.py) on the chores link when the next tick is due, one pass in
flight at a time, and keeps what the last pass said for the snapshot, metrics and logs.

Leaderless: every supervisor with schedules in its config runs passes; the schedule table's
guarded advance makes the first one to reach a tick enqueue it and the others find it done.
Timing: the pass reports the store's ``now`` and the next tick, and the next pass is sent that
many seconds after the reply's ``started`` (the monotonic clock every process of the host
shares), and at least every ``MAX_WAIT`` (a config that changed on another node, the clock
stepped): a tick is enqueued well within a second of its time while any supervisor runs. A
draining supervisor stops passing; the others carry on. Each pass carries the store's now
at the previous one (``since``): a tick that came after it was due while this supervisor
was passing, so a pass held up (a slow chore ahead of it on the link, a short store
backoff) still enqueues it as on time, not as missed per ``catch_up`` (schedules.plan).

Errors. The store being away (``StoreUnavailable``): the store backoff every chore shares. A
schedule the database refuses: that schedule's error (logged when it changes, shown in the
snapshot and ``fleetd status``); the others go on (run/schedulepass.py). Any other failed
pass (a bug, or a refusal outside any one schedule) comes back a ``StoreBug``, which the link
raises into the loop's guard after this side has logged it (``_pass_failed``): one rule for
every store call (run/link.py), so a broken pass stops the supervisor, its jobs released,
rather than leaving its schedules silently late.

Owned by the supervisor's main thread.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence

from supervisor.clock import Clock
from supervisor.errors import StoreUnavailable
from supervisor.model import iso
from supervisor.observe.snapshot import ScheduleView
from supervisor.run.link import Link, Reply
from supervisor.run.outbox import StoreHealth
from supervisor.run.requests import SchedulePass
from supervisor.run.schedulepass import Passes, PassReport, ScheduleOutcome
from supervisor.schedules import ScheduleSpec, lateness

log = logging.getLogger("fleetd.schedules")
MAX_WAIT = 5.0  # seconds between passes at most
EARLY = 0.005  # a pass sent this much after the tick: the store's clock has passed it
RETRY_AFTER_ERROR = 1.0
BACKOFF_MAX = 300.0  # a pass that keeps failing (not the store being away): this far apart
LOG_EVERY = 600.0  # the same failure is logged again after this long
OUTCOMES = ("on_time", "late", "missed", "skipped")


class Scheduler:
    def __init__(
        self, chores: Link, specs: Sequence[ScheduleSpec], clock: Clock, health: StoreHealth
    ) -> None:
        self.chores = chores
        self.specs = tuple(specs)
        self.clock = clock
        self.health = health
        self.passing = False  # a pass is in flight
        self.next_pass = 0.0  # monotonic; the first pass at the first tick of the loop
        self.report: PassReport | None = None
        self.report_at = 0.0  # monotonic: when the report's ``now`` was read
        # ticks this node decided, per (schedule, outcome): the metrics' counter
        self.ticks: Counter[tuple[str, str]] = Counter()
        self.errors: dict[str, str] = {}  # schedule -> why the database refused its write
        self.pass_error: str | None = None  # why the last pass failed (not the store away)
        self.pass_failures = 0  # passes failed in a row, the store being away aside
        self.pass_logged_at = 0.0  # monotonic: when the failure was last logged

    def tick(self, now: float, *, draining: bool) -> None:
        """Send a pass when one is due (never during a drain or a store backoff)."""
        if not self.specs or draining or self.passing:
            return
        if now < self.next_pass or now < self.health.retry_at:
            return
        self.passing = True
        report = self.report  # the previous pass's, and the first one's now
        passes = Passes(report.now, report.started) if report is not None else Passes()
        self.chores.submit(SchedulePass(self.specs, passes), on_reply=self._passed)

    def due_at(self) -> float | None:
        """When the loop must wake for the next pass (None: none is waited for)."""
        if not self.specs or self.passing:
            return None
        return max(self.next_pass, self.health.retry_at)

    def _passed(self, reply: Reply) -> None:
        self.passing = False
        now = self.clock.monotonic()
        if isinstance(reply.error, StoreUnavailable):
            self.next_pass = now + RETRY_AFTER_ERROR
            self.health.failed(now, "schedules", reply.error)
            return
        if reply.error is not None:
            self._pass_failed(now, reply.error)
            return
        if self.pass_failures:
            log.warning("schedules: a pass works again after %d failed", self.pass_failures)
            self.pass_failures, self.pass_error = 0, None
        report: PassReport = reply.value
        self.report, self.report_at = report, reply.started
        wait = MAX_WAIT
        if report.next_tick is not None and report.next_tick > report.now:
            # (a next tick at or before now would be a planning bug: MAX_WAIT, not a spin)
            wait = min(MAX_WAIT, report.next_tick - report.now + EARLY)
        self.next_pass = reply.started + wait
        for outcome in report.outcomes:
            self._note_error(outcome)
            if outcome.retimed is not None:
                spec = next(s for s in self.specs if s.name == outcome.name)
                log.warning(
                    "schedule %s: its timing changed from %s to %s: it starts afresh now, as "
                    "a new schedule (no tick of the new timing before now is due)",
                    outcome.name,
                    outcome.retimed,
                    spec.timing.fingerprint(),
                )
            if outcome.took:
                self._account(outcome)

    def _pass_failed(self, now: float, error: Exception) -> None:
        """Back off, and log on the first failure, a new reason, or every ``LOG_EVERY``
        (module docstring: why not the loop's error policy)."""
        self.pass_failures += 1
        backoff = min(BACKOFF_MAX, RETRY_AFTER_ERROR * 2 ** min(self.pass_failures - 1, 20))
        self.next_pass = now + backoff
        text = str(error)
        if text != self.pass_error or now - self.pass_logged_at >= LOG_EVERY:
            self.pass_logged_at = now
            log.error(
                "schedules: no schedule is enqueued: the pass failed (%d in a row; next in "
                "%.0fs): %s",
                self.pass_failures,
                backoff,
                text,
            )
        self.pass_error = text

    def _note_error(self, o: ScheduleOutcome) -> None:
        """Keep and log why a schedule is not enqueued here when that changes; it ends with
        a pass that writes it, or finds nothing due, without an error."""
        before = self.errors.get(o.name)
        if o.error is not None and o.error != before:
            self.errors[o.name] = o.error
            log.error(
                "schedule %s: not enqueued here (the other schedules go on; tried again at "
                "each tick, logged when this changes): %s",
                o.name,
                o.error,
            )
        elif o.error is None and before is not None and (o.took or o.plan.through is None):
            del self.errors[o.name]
            log.warning("schedule %s: enqueued here again (it was not: %s)", o.name, before)

    def _account(self, o: ScheduleOutcome) -> None:
        p = o.plan
        for key, n in zip(OUTCOMES, (p.on_time, p.late, p.missed, p.skipped), strict=True):
            if n:
                self.ticks[(o.name, key)] += n
        jobs = ", ".join(f"{iso(t)} (job {job})" for t, job in o.enqueued) or "none"
        for tick, job in o.enqueued:
            if tick in o.adopted:
                log.warning(
                    "schedule %s: the key of tick %s named job %s, there already (enqueued "
                    "by hand, or a restored database): it is the tick's job, none was added",
                    o.name,
                    iso(tick),
                    job,
                )
        if not (p.late or p.missed or p.skipped):
            log.debug("schedule %s: enqueued %s", o.name, jobs)
            return
        spec = next(s for s in self.specs if s.name == o.name)
        level = logging.WARNING if p.late or p.missed else logging.INFO  # downtime vs overlap
        log.log(
            level,
            "schedule %s: %d tick(s) missed their time (no pass decided them then: no "
            "supervisor ran, or the store was away), %d caught up, %d not enqueued by "
            "catch_up %s, %d skipped by overlap %s; enqueued: %s",
            o.name,
            p.late + p.missed,
            p.late,
            p.missed,
            spec.catch_up,
            p.skipped,
            spec.overlap,
            jobs,
        )

    def views(self, now: float) -> dict[str, ScheduleView]:
        """Each schedule as the last pass left it (for the snapshot)."""
        report = self.report
        out = {}
        for spec in self.specs:
            state = report.states.get(spec.name) if report else None
            plan = (
                next((o.plan for o in report.outcomes if o.name == spec.name), None)
                if report
                else None
            )
            store_now = report.now + (now - self.report_at) if report else None
            last = state.last if state else None
            out[spec.name] = ScheduleView(
                name=spec.name,
                kind=spec.kind,
                timing=spec.timing.describe(),
                policies=spec.policies(),
                last_tick=last.tick if last else None,
                last_job=last.job_id if last else None,
                last_state=str(last.state) if last and last.state else None,
                last_success_at=state.latest_success() if state else None,
                next_tick=plan.next_tick if plan else None,
                late_for=lateness(spec, state, store_now) if store_now is not None else 0.0,
                missed=state.missed if state else 0,
                ticks={k: self.ticks[(spec.name, k)] for k in OUTCOMES},
                error=self._error(spec.name),
            )
        return out

    def _error(self, name: str) -> str | None:
        if self.pass_error is not None:
            return f"the schedule pass fails: {self.pass_error}"
        return self.errors.get(name)
