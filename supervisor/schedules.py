"""Schedules, decided in pure functions: when a schedule ticks, and which of its due ticks a
pass enqueues. Values in, values out; the store process runs ``plan`` against a row it just
read (supervisor/run/schedulepass.py ``schedule_pass``) and writes the result in one guarded
transaction; the loop only asks for a pass when the next tick is due (supervisor/run/
scheduler.py).

Tick times are Unix seconds, whole seconds, the same on every host: ``every`` ticks are
multiples of the period since the Unix epoch (``every = "5m"``: :00, :05, ... UTC), and
``cron`` ticks are the cron library's for the expression in the schedule's time zone. So two
supervisors always name a tick alike, and its idempotency key ``schedule:<name>:<tick>`` makes
it one job however many enqueue it.

Which due ticks a pass enqueues (``plan``), given ``through`` (every tick up to it is
decided), ``now``, and ``since`` (the store's now at this supervisor's previous pass):

- the **on-time ticks**: every tick due after ``since``, when that pass was at most
  ``MISFIRE`` ago (this supervisor was passing when they came: its pass is late, held up
  behind a slow chore or a short store backoff, but nobody missed them), and the current
  tick, the latest one due, when it is at most ``grace`` late, min(one period,
  ``MISFIRE``); a supervisor that runs sees each tick within a second;
- the **missed ticks** (every other due tick: no pass decided it near its time, because no
  supervisor ran or the store was away for long): by ``catch_up``, none (``skip``), the latest
  (``once``) or the latest ``catch_up_max`` (``all``); the others are counted as missed;
- ``overlap = "skip"``: nothing while the last tick's job is queued (or waiting for a retry)
  or leased, and at most one tick a pass, the newest chosen: two ticks of the schedule never
  wait or run at once. The others are counted as skipped.

Cron library: cronsim (Debian cron's semantics, DST included; no dependencies; typed; backward
iteration), rather than croniter (more features, needs python-dateutil; its maintainer
announced its end in 2024, and it is maintained again under pallets-eco since). Time zones
come from zoneinfo, with the ``tzdata`` package as the database where the system has none.
"""

from __future__ import annotations

import json
import math
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from supervisor.model import JobState, NewJob, ScheduleState, iso

MISFIRE = 60.0  # a tick seen later than this (or than one period) was missed, not late
ON_TIME_MAX = int(MISFIRE) + 1  # on-time ticks in one pass at most (ticks are >= 1 s apart)
# ``fleetd status`` calls a due tick late only past its grace and this: how late a running
# supervisor's pass may be (the scheduler's MAX_WAIT of 5 s, the store backoff of up to 5 s,
# and a margin), so a short period is not "late" whenever a pass is
LATE_AFTER = 15.0
SCAN_CAP = 10_000  # due ticks counted one by one in one pass; past it, "at least"
# catch_up = "all" enqueues at most this many missed ticks in one pass (one transaction): a
# few seconds of inserts at most, far below the store call's limit, and below SCAN_CAP, so the
# ticks counted always include the ones enqueued
CATCH_UP_MAX = 1000
EVERY_MAX = 366 * 86_400  # longer (or calendar) periods: a cron expression
CATCH_UP = ("skip", "once", "all")
OVERLAP = ("skip", "allow")
_CHECK_FROM = datetime(2000, 1, 1, tzinfo=UTC)  # a cron is checked from here: does it match?
_CRON = 'expected five fields such as "0 2 * * *", or six with seconds first'


@lru_cache(maxsize=64)
def zone(name: str) -> ZoneInfo:
    """The time zone ``name``; ValueError (one line) when zoneinfo does not know it."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(
            f"{name!r} is not a time zone (expected an IANA name such as 'Europe/Paris')"
        ) from exc


@dataclass(frozen=True, slots=True)
class Timing:
    """When a schedule ticks: a cron expression in a time zone, or every N seconds."""

    cron: str | None = None
    every: int | None = None  # seconds, at least 1
    timezone: str = "UTC"

    @classmethod
    def of(cls, cron: str | None, every: float | None, timezone: str = "UTC") -> Timing:
        """Checked: ValueError with one line saying what is wrong."""
        if (cron is None) == (every is None):
            raise ValueError("cron and every (expected exactly one of them)")
        zone(timezone)
        if every is not None:
            if every < 1 or every != int(every):
                raise ValueError(f"{every:g}s is not a whole number of seconds (expected >= 1s)")
            if every > EVERY_MAX:
                days = EVERY_MAX // 86_400
                raise ValueError(
                    f"{every / 86_400:.0f} days is too long (expected at most {days} days; a "
                    "cron expression for a yearly or calendar date)"
                )
            return cls(every=int(every), timezone=timezone)
        assert cron is not None
        cron = " ".join(cron.split())  # one spelling per expression: the fingerprint's
        try:
            next(CronSim(cron, _CHECK_FROM))
        except CronSimError as exc:
            problem = str(exc)[:1].lower() + str(exc)[1:]
            raise ValueError(f"{cron!r} is not a cron expression: {problem} ({_CRON})") from None
        except StopIteration:
            raise ValueError(f"{cron!r} never matches within 50 years ({_CRON})") from None
        return cls(cron=cron, timezone=timezone)

    def describe(self) -> str:
        """``cron "0 2 * * *" (Europe/Paris)`` or ``every 300s``."""
        if self.every is not None:
            return f"every {self.every}s"
        return f'cron "{self.cron}" ({self.timezone})'

    def fingerprint(self) -> str:
        """What the schedule row keeps of the timing its ticks are decided by: a change
        starts the schedule afresh (run/schedulepass.py). The description itself: changing
        its text would restart every schedule once."""
        return self.describe()

    def after(self, t: float) -> float | None:
        """The first tick strictly after ``t``; None if the cron matches nothing within 50
        years of it."""
        if self.every is not None:
            return float((math.floor(t / self.every) + 1) * self.every)
        for moment in self._cron(t):
            if moment.timestamp() > t:  # not a tick of the repeated hour already past (_cron)
                return moment.timestamp()
        return None

    def next_ticks(self, t: float, n: int) -> tuple[float, ...]:
        """The first ``n`` ticks strictly after ``t``."""
        out: list[float] = []
        tick: float | None = t
        while len(out) < n and tick is not None:
            tick = self.after(tick)
            if tick is not None:
                out.append(tick)
        return tuple(out)

    def due(self, after: float, until: float, keep: int) -> tuple[int, tuple[float, ...]]:
        """Ticks in (``after``, ``until``]: how many (at most ``SCAN_CAP`` for a cron), and
        the latest ``keep`` of them, oldest first."""
        if until <= after:
            return 0, ()
        if self.every is not None:
            p = self.every
            first, last = math.floor(after / p) + 1, math.floor(until / p)
            count = max(0, last - first + 1)
            return count, tuple(float(k * p) for k in range(max(first, last - keep + 1), last + 1))
        latest: deque[float] = deque(maxlen=keep)
        count = 0
        for moment in self._cron(after):
            tick = moment.timestamp()
            if tick <= after:  # a tick of the repeated hour already past (_cron)
                continue
            if tick > until:
                return count, tuple(latest)
            count += 1
            latest.append(tick)
            if count >= SCAN_CAP:
                break
        # a gap of more than SCAN_CAP ticks: the latest ones, read backwards from ``until``
        back = CronSim(self.cron or "", _local(math.floor(until) + 1, self.timezone), reverse=True)
        newest: list[float] = []
        for moment in back:
            tick = moment.timestamp()
            if tick <= after or len(newest) >= keep:
                break
            if tick <= until:
                newest.append(tick)
        return count, tuple(sorted(set(newest)))

    def grace(self, tick: float) -> float:
        """How late ``tick`` may be seen and still count as on time: one period (to the
        next tick), at most ``MISFIRE``."""
        following = self.after(tick)
        return MISFIRE if following is None else min(MISFIRE, following - tick)

    def _cron(self, t: float) -> CronSim:
        """cronsim's ticks from ``t`` on. Hazard: started inside the repeated hour of a
        fall-back night (the second 02:10 in Paris), it reads the wall time and first yields
        a fixed-time tick of that night's first pass (02:30 CEST), already past; a reverse
        scan started there may skip one. Callers drop what is not after ``t``."""
        return CronSim(self.cron or "", _local(t, self.timezone))


def _local(t: float, timezone: str) -> datetime:
    return datetime.fromtimestamp(t, zone(timezone))


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """A schedule as the supervisor runs it: its timing, its policies, and the job it
    enqueues (``payload`` is JSON text; each tick adds ``scheduled_for``)."""

    name: str
    timing: Timing
    kind: str
    pool: str
    max_deliveries: int
    payload: str = "{}"
    tenant: str | None = None
    priority: int = 0
    catch_up: str = "once"
    catch_up_max: int = 10
    overlap: str = "skip"

    def __post_init__(self) -> None:
        if not 1 <= self.catch_up_max <= CATCH_UP_MAX:
            raise ValueError(f"catch_up_max {self.catch_up_max} (expected 1 to {CATCH_UP_MAX})")

    def policies(self) -> str:
        """``catch_up once, overlap skip`` (``all`` shows its cap)."""
        cap = f" (max {self.catch_up_max})" if self.catch_up == "all" else ""
        return f"catch_up {self.catch_up}{cap}, overlap {self.overlap}"


def tick_key(name: str, tick: float) -> str:
    """The tick's idempotency key: ``schedule:<name>:<tick time, ISO 8601 UTC>``."""
    return f"schedule:{name}:{iso(tick)}"


def tick_job(spec: ScheduleSpec, tick: float) -> NewJob:
    """The job of one tick: the schedule's payload plus ``scheduled_for``, keyed."""
    payload = {**json.loads(spec.payload), "scheduled_for": iso(tick)}
    return NewJob(
        kind=spec.kind,
        pool=spec.pool,
        payload=json.dumps(payload, separators=(",", ":")),
        max_deliveries=spec.max_deliveries,
        tenant=spec.tenant,
        key=tick_key(spec.name, tick),
        priority=spec.priority,
    )


@dataclass(frozen=True, slots=True)
class TickPlan:
    """What one pass does with a schedule. ``through`` None: nothing was due (nothing to
    write). Counts: ``on_time`` and ``late`` ticks enqueued (``late``: by catch-up),
    ``missed`` (not enqueued: catch_up) and ``skipped`` (not enqueued: overlap)."""

    enqueue: tuple[float, ...] = ()
    through: float | None = None
    on_time: int = 0
    late: int = 0
    missed: int = 0
    skipped: int = 0
    next_tick: float | None = None

    @property
    def not_enqueued(self) -> int:
        return self.missed + self.skipped


def plan(
    spec: ScheduleSpec, state: ScheduleState, now: float, since: float | None = None
) -> TickPlan:
    """Which of the ticks due since ``state.through`` to enqueue at ``now`` (module doc);
    ``since``: the store's now at this supervisor's previous pass (None: its first)."""
    timing = spec.timing
    if since is not None and not 0 <= now - since <= MISFIRE:
        since = None  # passes stopped for longer (the store away): downtime, per catch_up
    count, latest = timing.due(state.through, now, spec.catch_up_max + ON_TIME_MAX)
    next_tick = timing.after(now)
    if count == 0:
        return TickPlan(next_tick=next_tick)
    current = latest[-1]
    if current <= state.through:  # due() only returns later ticks: the row never goes back
        return TickPlan(next_tick=next_tick)
    on_time = tuple(
        t
        for t in latest
        if (since is not None and t > since) or (t == current and now - t <= timing.grace(t))
    )
    late = latest[: len(latest) - len(on_time)]  # the on-time ones are the newest
    caught_up = {"skip": (), "once": late[-1:], "all": late[-spec.catch_up_max :]}[spec.catch_up]
    chosen = (*caught_up, *on_time)
    missed = max(0, count - len(on_time) - len(caught_up))  # a capped count: "at least"
    skipped = 0
    if spec.overlap == "skip" and chosen and (state.busy() or len(chosen) > 1):
        keep_one = () if state.busy() else chosen[-1:]
        skipped = len(chosen) - len(keep_one)
        chosen = keep_one
    on_time_chosen = len([t for t in chosen if t in on_time])
    return TickPlan(
        enqueue=chosen,
        through=current,
        on_time=on_time_chosen,
        late=len(chosen) - on_time_chosen,
        missed=missed,
        skipped=skipped,
        next_tick=next_tick,
    )


def lateness(spec: ScheduleSpec, state: ScheduleState | None, now: float) -> float:
    """Seconds the oldest undecided due tick is past its grace and ``LATE_AFTER`` (0: none
    is): no pass decided it in time, because no running supervisor has this schedule, or
    their passes fail or are held up."""
    if state is None:
        return 0.0
    first = spec.timing.after(state.through)
    if first is None or first > now:
        return 0.0
    return max(0.0, now - first - max(spec.timing.grace(first), LATE_AFTER))


def stuck_for(spec: ScheduleSpec, state: ScheduleState | None, now: float) -> float:
    """Seconds the last tick's job has stayed queued (waiting, or for a retry) past the
    schedule's next tick and ``LATE_AFTER`` (0: it has not): with ``overlap = "skip"`` no
    later tick is enqueued until it runs; with ``"allow"`` they queue behind it."""
    last = state.last if state is not None else None
    if last is None or last.state != JobState.QUEUED:
        return 0.0
    following = spec.timing.after(last.tick)
    if following is None:
        return 0.0
    return max(0.0, now - following - LATE_AFTER)


def describe(spec: ScheduleSpec) -> dict[str, Any]:
    """The schedule's settings as plain values (``fleetd check``, ``fleetd schedules``)."""
    return {
        "kind": spec.kind,
        "pool": spec.pool,
        "cron": spec.timing.cron,
        "every": spec.timing.every,
        "timezone": spec.timing.timezone,
        "catch_up": spec.catch_up,
        "catch_up_max": spec.catch_up_max,
        "overlap": spec.overlap,
        "tenant": spec.tenant,
        "priority": spec.priority,
    }
