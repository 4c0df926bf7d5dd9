"""The invariants of ``python -m stress chaos``, as pure functions over what the run collected.

``Evidence`` holds the facts: the jobs the run enqueued (and which of them are poison, with the
error kind each must die of), every row of the store, the handlers' execution log, every
failure the supervisors logged (``log_format = "json"``: one ``job_failed`` object per failed
delivery, with node, attempt and error kind), and the harness's own record of what it did:
each supervisor process (its node id, pid, and how it ended: SIGKILL, drain, leave, final
stop) and each worker it SIGKILLed. ``check(evidence)`` returns a ``Report``: every figure,
grouped in sections, and the violations (any one makes the run fail).

What a fault may legitimately cause, and how it is told apart from a bug:

- A worker SIGKILLed by the harness fails its job as ``crashed`` ("killed by SIGKILL (not by
  fleetd ...)"): explained when the harness killed a worker of that supervisor within
  ``KILL_WINDOW`` seconds before the supervisor logged the failure.
- A SIGKILLed supervisor's jobs come back when their lease expires: ``attempts`` counts that
  lost delivery, nothing is logged for it (the supervisor is gone), and at the delivery limit
  the reaper dead-letters the job as ``lease_expired`` naming the node. Explained when the node
  named was SIGKILLed by the harness; a lease that expired under any other node is a violation
  (a drained node must have released it; a live node must have extended it).
- A completed execution whose result never reached the store (the worker or its supervisor was
  killed between the handler's return and the ack, or a drain killed it at the end of its grace
  period) runs again: a duplicate. Explained when that execution's worker was killed by the
  harness, its supervisor was SIGKILLed, or its supervisor was draining when it ended.
- A restart of the PostgreSQL server (``--allow-db-restart``) ends every connection: the
  supervisors retry with backoff and keep their leases when the outage is shorter than the
  lease. If it is not (or a claim committed but its reply was lost), a lease runs out under a
  live supervisor: it kills the worker ("its lease ran out while the database was
  unreachable") and a reaper requeues or dead-letters the job as ``lease_expired``; a result
  held in the outbox past the lease is refused, and the job runs again. Each of these is
  explained only when it was logged (the lost lease, the reaper's expiry) or ended (the
  execution) between the start of a restart and ``OUTAGE_REACH`` seconds after the server
  accepted connections again; the explained ones are counted in the "database" section.

A poison job dead of a harness fault on its last delivery (``crashed`` by a worker kill, or
``lease_expired`` after a supervisor kill or around a database restart) has still reached
``max_deliveries``: it is counted as an explained variation, not as a violation.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from supervisor.model import Job, JobState

DEADLINE_SLACK = 1.0  # s a timeout kill may come after the job's timeout (the supervisor's bound)
KILL_WINDOW = 3.0  # s between a harness worker kill and the supervisor's failure line for it
END_SLACK = 0.5  # s of clock slack when comparing a handler's end with a harness event
NOT_BY_FLEETD = "not by fleetd"
# s after a database restart that its effects may still be logged: a lease (3 s) running out
# while the supervisor backs off between store calls (at most 5 s), plus slack
OUTAGE_REACH = 10.0
_EXPIRED_BY = re.compile(r"the lease held by node (\S+) expired")


@dataclass(frozen=True, slots=True)
class PlannedJob:
    """One enqueued job as the harness planned it. ``expect``: the error kind a poison job
    must die of; None for a normal job, which must end done."""

    kind: str
    pool: str
    expect: str | None = None


@dataclass(slots=True)
class NodeRun:
    """One supervisor process the harness started. ``how`` it was stopped: "kill" (SIGKILL),
    "drain" (SIGTERM, a rolling deploy: replaced), "leave" (SIGTERM, a joined node leaving),
    "stop" (SIGTERM at the end of the run); None while running, or if it died on its own."""

    name: str
    role: str  # "base" or "guest"
    pid: int
    started: float
    signalled: float | None = None
    how: str | None = None
    exited: float | None = None
    exit_code: int | None = None
    held: tuple[int, ...] = ()  # jobs it held leased when SIGKILLed
    left: tuple[int, ...] = ()  # jobs still leased under its name once its drain ended


@dataclass(frozen=True, slots=True)
class WorkerKill:
    """A worker the harness SIGKILLed; ``job`` as its process title showed it (None: idle)."""

    t: float
    node: str
    pid: int
    pool: str | None
    job: int | None


@dataclass(frozen=True, slots=True)
class DbRestart:
    """A restart of the PostgreSQL server by the harness: ``began`` when it ran
    ``pg_ctlcluster restart``, ``ready`` when ``pg_isready`` said the server accepts
    connections after the command returned; ``down_from`` and ``down_to``: the first and the
    last time ``pg_isready``, polled while the command ran, found it refusing (None if never)."""

    began: float
    ready: float
    down_from: float | None = None
    down_to: float | None = None


@dataclass(frozen=True, slots=True)
class LeaseEvent:
    """A supervisor's log line about one job's lease: lost while it ran the job (its worker
    killed), or found expired by its reaper (``job_lease_expired``, or ``job_dead`` of
    ``lease_expired``)."""

    t: float
    node: str
    job: int


@dataclass(frozen=True, slots=True)
class LoggedFailure:
    """One ``job_failed`` line of a supervisor's JSON log."""

    t: float
    node: str
    job: int
    attempt: int
    error_kind: str
    message: str
    duration: float | None = None  # how long the delivery ran, as the supervisor measured it


@dataclass(slots=True)
class Evidence:
    plan: dict[int, PlannedJob]
    jobs: dict[int, Job]
    executions: list[dict[str, Any]]
    nodes: list[NodeRun]
    kills: list[WorkerKill]
    failures: list[LoggedFailure]
    max_deliveries: dict[str, int]  # pool -> max_deliveries
    caps: dict[str, int] = field(default_factory=dict)  # kind -> its pool's max_inflight
    torn_lines: int = 0
    lost_leases: list[LeaseEvent] = field(default_factory=list)
    expired_leases: list[LeaseEvent] = field(default_factory=list)  # the reapers' lines
    log_problems: list[str] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)
    orphans_after_kill: int = 0  # a job's processes alive 1.5 s after its supervisor's SIGKILL
    orphans_after_restart: int = 0  # ... and 6 s after, its replacement started
    bomb_procs_max: int | None = None
    nproc_limit: int | None = None
    bomb_workers_max: int = 0  # workers of the bomb user's pool, all supervisors together
    timed_out: bool = False
    db_restarts: list[DbRestart] = field(default_factory=list)
    stalls: list[DbRestart] = field(default_factory=list)  # the database stalled, not down
    timeouts: dict[str, float] = field(default_factory=dict)  # pool -> its job timeout


@dataclass(slots=True)
class Report:
    figures: dict[str, dict[str, Any]] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)

    def add(self, section: str, name: str, value: Any) -> None:
        self.figures.setdefault(section, {})[name] = value

    def fail(self, text: str) -> None:
        self.violations.append(text)

    def flat(self) -> dict[str, Any]:
        """Every figure as ``section.name``: value (for JSON and tests)."""
        return {f"{s}.{n}": v for s, names in self.figures.items() for n, v in names.items()}


def _some(ids: Iterable[Any], n: int = 8) -> str:
    ids = sorted(ids)
    more = f" (+{len(ids) - n} more)" if len(ids) > n else ""
    return ", ".join(map(str, ids[:n])) + more


def check(ev: Evidence) -> Report:
    """Every invariant; see the module doc."""
    report = Report()
    ctx = _Context(ev)
    _totals(ev, report)
    _poison(ev, ctx, report)
    _normal(ev, ctx, report)
    _duplicates(ev, ctx, report)
    _drains(ev, ctx, report)
    _outages(ev, ctx, report)
    _deadlines(ev, report)
    _silent(ev, ctx, report)
    _caps(ev, report)
    _processes(ev, report)
    return report


class _Context:
    """Lookups shared by the checks."""

    def __init__(self, ev: Evidence) -> None:
        self.by_pid = {n.pid: n for n in ev.nodes}
        self.by_name = {n.name: n for n in ev.nodes}
        self.killed_nodes = {n.name for n in ev.nodes if n.how == "kill"}
        self.drained_nodes = {n.name for n in ev.nodes if n.how in ("drain", "leave", "stop")}
        self.killed_pids = {k.pid: k for k in ev.kills}
        self.kills_by_node: dict[str, list[WorkerKill]] = defaultdict(list)
        for k in ev.kills:
            self.kills_by_node[k.node].append(k)
        self.failures_by_job: dict[int, list[LoggedFailure]] = defaultdict(list)
        for f in ev.failures:
            self.failures_by_job[f.job].append(f)
        self.runs_by_job: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for r in ev.executions:
            if isinstance(r.get("job"), int):
                self.runs_by_job[r["job"]].append(r)
        self.matched_kills: set[int] = set()  # pids of harness kills a failure was matched to
        for f in ev.failures:
            self.harness_kill_for(f)
        self.restarts = [*ev.db_restarts, *ev.stalls]  # outages: the database away a while
        self.expired_at: dict[int, float] = {}  # job -> when a reaper last found it expired
        for e in ev.expired_leases:
            self.expired_at[e.job] = max(e.t, self.expired_at.get(e.job, e.t))
        self.restart_expired: set[int] = set()  # jobs whose expiry a restart explained

    def near_restart(self, t: float) -> bool:
        """``t`` falls from the start of a database restart to OUTAGE_REACH after its end."""
        return any(r.began - END_SLACK <= t <= r.ready + OUTAGE_REACH for r in self.restarts)

    def expired_near_restart(self, job: Job) -> bool:
        """The job's lease expiry (its last error) was found by a reaper near a restart."""
        t = self.expired_at.get(job.id)
        if t is None or not self.near_restart(t):
            return False
        self.restart_expired.add(job.id)
        return True

    def harness_kill_for(self, f: LoggedFailure) -> WorkerKill | None:
        """The harness worker kill that explains a ``crashed`` failure, if any: on the same
        node, within KILL_WINDOW before the failure was logged; the one naming the job first."""
        if f.error_kind != "crashed" or NOT_BY_FLEETD not in f.message:
            return None
        near = [
            k
            for k in self.kills_by_node.get(f.node, ())
            if -END_SLACK <= f.t - k.t <= KILL_WINDOW  # log times are in whole milliseconds
        ]
        near.sort(key=lambda k: (k.job != f.job, f.t - k.t))
        if near:
            self.matched_kills.add(near[0].pid)
            return near[0]
        return None

    def expired_under(self, job: Job) -> str | None:
        """The node named by a ``lease_expired`` last error."""
        if str(job.error_kind) != "lease_expired" or not job.last_error:
            return None
        m = _EXPIRED_BY.search(job.last_error)
        return m[1] if m else "?"


def _totals(ev: Evidence, report: Report) -> None:
    enqueued = set(ev.plan)
    stored = set(ev.jobs)
    lost = enqueued - stored
    extra = stored - enqueued
    states = Counter(str(j.state) for j in ev.jobs.values())
    report.add("jobs", "enqueued", len(enqueued))
    report.add("jobs", "in the store", len(stored & enqueued))
    report.add("jobs", "lost", len(lost))
    report.add("jobs", "unexpected rows", len(extra))
    for state in JobState:
        report.add("jobs", str(state), states.get(str(state), 0))
    report.add("jobs", "executions logged", len(ev.executions))
    report.add("jobs", "torn log lines", ev.torn_lines)
    if lost:
        report.fail(f"{len(lost)} enqueued job(s) missing from the store: {_some(lost)}")
    if extra:
        report.fail(f"{len(extra)} row(s) the run never enqueued: {_some(extra)}")
    unfinished = [j.id for j in ev.jobs.values() if j.state not in (JobState.DONE, JobState.DEAD)]
    if unfinished:
        report.fail(
            f"{len(unfinished)} job(s) not final at the end"
            + (" (the run timed out)" if ev.timed_out else "")
            + f": {_some(unfinished)}"
        )
    if ev.torn_lines:
        report.fail(f"{ev.torn_lines} execution-log line(s) could not be parsed (torn writes?)")


def _poison(ev: Evidence, ctx: _Context, report: Report) -> None:
    poison = {i: p for i, p in ev.plan.items() if p.expect is not None}
    by_kind: dict[str, Counter[str]] = defaultdict(Counter)
    explained: Counter[str] = Counter()
    for job_id, planned in sorted(poison.items()):
        job = ev.jobs.get(job_id)
        if job is None:
            continue
        got = str(job.error_kind) if job.error_kind else "-"
        by_kind[planned.kind][got if job.state == JobState.DEAD else str(job.state)] += 1
        if job.state != JobState.DEAD:
            if job.state == JobState.DONE:
                report.fail(f"poison job {job_id} ({planned.kind}) ended done")
            continue
        limit = ev.max_deliveries.get(planned.pool)
        if limit is not None and job.attempts != limit:
            report.fail(
                f"poison job {job_id} ({planned.kind}) dead after {job.attempts} deliveries, "
                f"not max_deliveries {limit}: {got}: {job.last_error}"
            )
        if got == planned.expect:
            continue
        why = _last_delivery_fault(job, ctx)
        if why:
            explained[why] += 1
        else:
            report.fail(
                f"poison job {job_id} ({planned.kind}) dead of {got}, expected "
                f"{planned.expect}: {job.last_error}"
            )
    report.add("poison", "enqueued", len(poison))
    report.add(
        "poison", "dead", sum(1 for i in poison if ev.jobs.get(i) and ev.jobs[i].state == "dead")
    )
    for kind in sorted(by_kind):
        expect = next(p.expect for p in poison.values() if p.kind == kind)
        outcome = ", ".join(f"{k} {n}" for k, n in by_kind[kind].most_common())
        report.add("poison", f"{kind} (expect {expect})", outcome)
    report.add(
        "poison",
        "other kind, explained by a fault on the last delivery",
        ", ".join(f"{k} {n}" for k, n in explained.items()) or "0",
    )


def _last_delivery_fault(job: Job, ctx: _Context) -> str | None:
    """Why a dead job's error kind is a harness fault on its last delivery, or None."""
    node = ctx.expired_under(job)
    if node is not None:
        if node in ctx.killed_nodes:
            return "lease_expired (supervisor SIGKILLed)"
        return "lease_expired (database restart)" if ctx.expired_near_restart(job) else None
    if str(job.error_kind) == "crashed":
        last = [f for f in ctx.failures_by_job.get(job.id, ()) if f.attempt == job.attempts]
        if any(ctx.harness_kill_for(f) for f in last):
            return "crashed (worker SIGKILLed by the harness)"
    return None


def _normal(ev: Evidence, ctx: _Context, report: Report) -> None:
    normal = {i: p for i, p in ev.plan.items() if p.expect is None}
    done = [ev.jobs[i] for i in normal if i in ev.jobs and ev.jobs[i].state == JobState.DONE]
    dead = [ev.jobs[i] for i in normal if i in ev.jobs and ev.jobs[i].state == JobState.DEAD]
    report.add("normal", "enqueued", len(normal))
    report.add("normal", "done", len(done))
    report.add("normal", "dead", len(dead))
    for job in dead:
        report.fail(
            f"normal job {job.id} ({normal[job.id].kind}) dead after {job.attempts} "
            f"deliveries: {job.error_kind}: {job.last_error}"
        )
    # every failed delivery a supervisor logged for a normal job must be a fault's or flaky's
    causes: Counter[str] = Counter()
    for job_id, planned in normal.items():
        for f in ctx.failures_by_job.get(job_id, ()):
            if f.error_kind == "exception" and planned.kind == "flaky":
                causes["flaky (exception, planned)"] += 1
            elif ctx.harness_kill_for(f):
                causes["crashed (worker SIGKILLed by the harness)"] += 1
            else:
                causes[f"UNEXPLAINED {f.error_kind}"] += 1
                report.fail(
                    f"normal job {job_id} ({planned.kind}) attempt {f.attempt} on {f.node} "
                    f"failed: {f.error_kind}: {f.message}"
                )
    for job in done:
        node = ctx.expired_under(job)
        if node is not None and node not in ctx.killed_nodes and not ctx.expired_near_restart(job):
            report.fail(
                f"normal job {job.id}: a lease expired under {node}, which was not SIGKILLed"
                f" ({job.last_error})"
            )
    for cause, n in sorted(causes.items()):
        report.add("normal", f"failed deliveries: {cause}", n)
    flaky = [ev.jobs[i] for i, p in normal.items() if p.kind == "flaky" and i in ev.jobs]
    report.add(
        "normal", "flaky done / enqueued", f"{sum(j.state == 'done' for j in flaky)}/{len(flaky)}"
    )
    no_run = [
        j.id
        for j in done
        if not any(r.get("outcome") == "ok" for r in ctx.runs_by_job.get(j.id, ()))
    ]
    report.add("normal", "done without a completed execution", len(no_run))
    if no_run:
        report.fail(f"{len(no_run)} job(s) done with no completed execution: {_some(no_run)}")
    _latency(done, normal, report)


def _silent(ev: Evidence, ctx: _Context, report: Report) -> None:
    """Deliveries that ended with no outcome: ``attempts`` counted them, no supervisor logged a
    failure, and no ack or release gave them back. Only an expired lease does that, and leases
    may only expire under a SIGKILLed supervisor (the jobs it held at the kill), after a
    live one lost a lease (itself a violation unless near a database restart), or around a
    database restart (the reapers' expiries logged then). So their number is bounded by
    those."""
    silent = 0
    counts = Counter(f.job for f in ev.failures)
    for job_id in ev.plan:
        job = ev.jobs.get(job_id)
        if job is None:
            continue
        ended = job.attempts - (1 if job.state == JobState.DONE else 0)
        silent += max(0, ended - counts.get(job_id, 0))
    held = sum(len(n.held) for n in ev.nodes if n.how == "kill")
    near = sum(1 for e in ev.expired_leases if ctx.near_restart(e.t))
    report.add("faults", "deliveries that ended with no outcome (expired leases)", silent)
    if silent > held + len(ev.lost_leases) + near:
        report.fail(
            f"{silent} deliveries ended with no outcome, but SIGKILLed supervisors held only "
            f"{held} job(s), {len(ev.lost_leases)} lease(s) were lost"
            + (f" and {near} expired near a database restart" if ev.db_restarts else "")
        )


def _latency(done: Sequence[Job], normal: dict[int, PlannedJob], report: Report) -> None:
    """Pickup (started - enqueued) of first-delivery jobs per pool, and the run's rate."""
    by_pool: dict[str, list[float]] = defaultdict(list)
    for job in done:
        if job.attempts == 1 and job.started_at is not None:
            by_pool[normal[job.id].pool].append(job.started_at - job.enqueued_at)
    for pool in sorted(by_pool):
        waits = sorted(by_pool[pool])
        report.add(
            "latency",
            f"{pool} pickup p50 / p99 / max",
            f"{_pct(waits, 0.5):.3f}s / {_pct(waits, 0.99):.3f}s / {waits[-1]:.3f}s",
        )
    if done:
        first = min(j.enqueued_at for j in done)
        last = max(j.finished_at or 0.0 for j in done)
        report.add(
            "latency",
            "normal jobs done per second (paced by the feed)",
            round(len(done) / (last - first), 1),
        )


def _pct(values: Sequence[float], q: float) -> float:
    return values[max(0, math.ceil(q * len(values)) - 1)]


def _duplicates(ev: Evidence, ctx: _Context, report: Report) -> None:
    """Jobs with more than one completed execution, each extra one explained by a kill."""
    dup_jobs = 0
    extra_runs = 0
    causes: Counter[str] = Counter()
    for job_id, runs in ctx.runs_by_job.items():
        completed = [r for r in runs if r.get("outcome") == "ok"]
        if len(completed) < 2:
            continue
        dup_jobs += 1
        extra_runs += len(completed) - 1
        reasons = [_completed_but_lost(r, ctx) for r in completed]
        known = [r for r in reasons if r]
        causes.update(known[: len(completed) - 1])
        if len(known) < len(completed) - 1:
            report.fail(
                f"job {job_id} completed {len(completed)} times and no kill explains it: "
                + "; ".join(
                    f"pid {r['pid']} (supervisor {r.get('ppid')}) attempt {r['attempt']}"
                    for r in completed
                )
            )
    report.add("duplicates", "jobs completed more than once", dup_jobs)
    report.add("duplicates", "extra completed executions", extra_runs)
    for cause, n in sorted(causes.items()):
        report.add("duplicates", f"explained by {cause}", n)


def _completed_but_lost(run: dict[str, Any], ctx: _Context) -> str | None:
    """Why a completed execution's result may never have been recorded, or None."""
    end = run.get("end") or 0.0
    kill = ctx.killed_pids.get(run.get("pid", -1))
    if kill is not None and kill.t >= end - END_SLACK:
        return "a worker kill"
    node = ctx.by_pid.get(run.get("ppid", -1))
    if node is not None and node.signalled is not None and node.signalled <= end + END_SLACK:
        if node.how == "kill":
            return "a supervisor SIGKILL"
        if node.how in ("drain", "leave", "stop"):
            return "a drain's kill at the end of its grace period"
    return "a database restart" if ctx.near_restart(end) else None


def _drains(ev: Evidence, ctx: _Context, report: Report) -> None:
    drains = [n for n in ev.nodes if n.how in ("drain", "leave")]
    kills = [n for n in ev.nodes if n.how == "kill"]
    report.add("faults", "worker kills (SIGKILL)", len(ev.kills))
    report.add("faults", "worker kills matched to a crashed delivery", len(ctx.matched_kills))
    report.add(
        "faults",
        "worker kills between two jobs (nothing failed)",
        len(ev.kills) - len(ctx.matched_kills),
    )
    report.add("faults", "supervisor kills (SIGKILL, restarted)", len(kills))
    report.add("faults", "jobs in flight at a supervisor kill", sum(len(n.held) for n in kills))
    report.add(
        "faults",
        "drains (SIGTERM, restarted: rolling deploy)",
        sum(n.how == "drain" for n in ev.nodes),
    )
    report.add("faults", "joins and leaves (SIGTERM)", sum(n.how == "leave" for n in ev.nodes))
    report.add("faults", "database server restarts", len(ev.db_restarts))
    report.add("faults", "database stalls", len(ev.stalls))
    report.add("faults", "supervisor processes started", len(ev.nodes))
    took = [n.exited - n.signalled for n in drains if n.exited and n.signalled]
    if took:
        report.add("drains", "SIGTERM to exit, max", f"{max(took):.2f}s")
        report.add("drains", "SIGTERM to exit, mean", f"{sum(took) / len(took):.2f}s")
    bad_exit = [n for n in ev.nodes if n.how in ("drain", "leave", "stop") and n.exit_code != 0]
    report.add("drains", "non-zero exits after SIGTERM", len(bad_exit))
    for n in bad_exit:
        report.fail(f"supervisor {n.name} exited {n.exit_code} after SIGTERM ({n.how})")
    died = [n for n in ev.nodes if n.how is None and n.exited is not None]
    for n in died:
        report.fail(f"supervisor {n.name} (pid {n.pid}) exited on its own with {n.exit_code}")
    left = [(n.name, j) for n in drains for j in n.left]
    report.add("drains", "jobs left leased by a drained supervisor", len(left))
    for name, job in left:
        report.fail(f"job {job} still leased by {name} after its drain ended")
    expired_drained = [
        j.id
        for j in ev.jobs.values()
        if ctx.expired_under(j) in ctx.drained_nodes and not ctx.expired_near_restart(j)
    ]
    report.add("drains", "leases that expired under a drained supervisor", len(expired_drained))
    if expired_drained:
        report.fail(
            f"{len(expired_drained)} job(s) waited out a lease of a drained supervisor: "
            f"{_some(expired_drained)}"
        )
    report.add("drains", "leases lost by a live supervisor (worker killed)", len(ev.lost_leases))
    for e in ev.lost_leases:
        if e.node not in ctx.killed_nodes and not ctx.near_restart(e.t):
            report.fail(f"supervisor {e.node} lost the lease of job {e.job} while running it")
    for problem in ev.log_problems:
        report.fail(problem)


def _deadlines(ev: Evidence, report: Report) -> None:
    """Every ``timeout`` failure was killed at its deadline: no later than the pool's timeout
    plus one second after the delivery started, stalls of the database included (the kill
    never waits for a store call)."""
    late: list[tuple[int, float, float]] = []
    during = 0
    for f in ev.failures:
        planned = ev.plan.get(f.job)
        limit = ev.timeouts.get(planned.pool) if planned else None
        if f.error_kind != "timeout" or f.duration is None or limit is None:
            continue
        end = f.t
        if any(s.began <= end <= s.ready for s in ev.stalls):
            during += 1
        if f.duration > limit + DEADLINE_SLACK:
            late.append((f.job, f.duration, limit))
    report.add("deadlines", "timeout kills while the database stalled", during)
    report.add("deadlines", "timeout kills later than timeout + 1 s", len(late))
    for job, took, limit in late[:8]:
        report.fail(f"job {job}: killed {took:.2f}s after its start, timeout {limit:g}s")


def _outages(ev: Evidence, ctx: _Context, report: Report) -> None:
    """How long each database restart or stall took, how long the server refused
    connections, and what the checks above let pass because it happened near one."""
    if ev.stalls:
        took = [s.ready - s.began for s in ev.stalls]
        report.add(
            "database",
            "stalls (connections open, nothing answered), max / mean",
            f"{len(ev.stalls)}: {_max_mean(took)}",
        )
    if not ev.db_restarts:
        return
    took = [r.ready - r.began for r in ev.db_restarts]
    down = [r.down_to - r.down_from for r in ev.db_restarts if r.down_to and r.down_from]
    report.add("database", "restart command until accepting, max / mean", _max_mean(took))
    report.add("database", "refusing connections (pg_isready), max / mean", _max_mean(down))
    lost = [e for e in ev.lost_leases if e.node not in ctx.killed_nodes and ctx.near_restart(e.t)]
    report.add("database", "leases lost by a live supervisor near a restart", len(lost))
    report.add(
        "database",
        "leases expired under a live supervisor near a restart",
        len(ctx.restart_expired),
    )


def _max_mean(values: Sequence[float]) -> str:
    return f"{max(values):.2f}s / {sum(values) / len(values):.2f}s" if values else "-"


def _caps(ev: Evidence, report: Report) -> None:
    """Fleet-wide caps: completed executions of a capped kind never overlapped more than the
    cap, and the file-lock semaphore behind it never made a job wait."""
    for kind, cap in sorted(ev.caps.items()):
        runs = [
            r
            for r in ev.executions
            if r.get("kind") == kind and r.get("outcome") == "ok" and r.get("end")
        ]
        points = sorted(
            [(r["start"], 1) for r in runs] + [(r["end"], -1) for r in runs],
            key=lambda p: (p[0], p[1]),  # an end before a start at the same instant
        )
        now = peak = 0
        for _, step in points:
            now += step
            peak = max(peak, now)
        waited = [r.get("waited", 0.0) for r in runs]
        slow = [w for w in waited if w > 0.05]
        report.add("caps", f"{kind}: max_inflight", cap)
        report.add("caps", f"{kind}: most executions at once", peak)
        report.add("caps", f"{kind}: waits for a semaphore slot > 50 ms", len(slow))
        if peak > cap:
            report.fail(f"{kind}: {peak} executions at once, over max_inflight {cap}")
        if slow:
            report.fail(
                f"{kind}: {len(slow)} execution(s) waited for a slot (max {max(slow):.3f}s)"
            )


def _processes(ev: Evidence, report: Report) -> None:
    report.add("processes", "left behind at the end", len(ev.leftovers))
    # PR_SET_PDEATHSIG reaches the worker, not the processes its job started: after a
    # supervisor's SIGKILL they run on (a finding, not an invariant: see docs/benchmarks.md)
    report.add(
        "processes",
        "job processes alive 1.5 s after their supervisor's SIGKILL",
        ev.orphans_after_kill,
    )
    report.add("processes", "... and 6 s after (its replacement running)", ev.orphans_after_restart)
    if ev.bomb_procs_max is not None:
        report.add("processes", "most processes of the bomb user at once", ev.bomb_procs_max)
        report.add("processes", "nproc_limit", ev.nproc_limit)
        # RLIMIT_NPROC refuses a fork once the user has that many processes, but a worker
        # forked by root and switched to the user afterwards is not refused: each live worker
        # of the pool can add one over the limit
        ceiling = (ev.nproc_limit or 0) + ev.bomb_workers_max
        report.add("processes", "allowed (nproc_limit + the pool's workers)", ceiling)
        if ev.nproc_limit is not None and ev.bomb_procs_max > ceiling:
            report.fail(
                f"{ev.bomb_procs_max} processes of the bomb user at once, over nproc_limit "
                f"{ev.nproc_limit} plus {ev.bomb_workers_max} workers"
            )
    for proc in ev.leftovers:
        report.fail(f"left behind: {proc}")
