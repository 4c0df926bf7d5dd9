"""The health verdict: pure, from a snapshot (and how old it is). ``/healthz`` judges the
supervisor's own latest snapshot; ``fleetd check --live`` judges every node's row.

Healthy means all of:
- the loop is alive: the snapshot is fresh (``LOOP_STALE``). Served from the loop itself, a
  /healthz that answers at all proves it; from the node table, the row's heartbeat does;
- every pool with ready work finished a job within its progress window (timeout + soft
  window + slack) or its oldest ready job is younger than that (the queue moves elsewhere);
  not judged while the node drains, nor for a pool with a pause in force (both claim
  nothing on purpose: a paused pool's growing backlog is what the operator asked for);
- no worker is wedged:
  - busy and silent past its deadline, soft window and ``KILL_GRACE`` (the watchdog's kill
    should have ended it: a process in uninterruptible sleep, or a kill that did not work);
  - killed ``KILL_GRACE`` ago and still not reaped;
  - idle and its Ping unanswered for longer than the pool's ping timeout (stopped, stuck);
  - forked ``STARTING_GRACE`` ago and never said Ready.

A database outage alone is not unhealthy: the supervisor rides it out, and a restart would
not bring the database back (the body says so; the store's state is in the status view).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from supervisor.observe.snapshot import FleetSnapshot, PoolView, WorkerView

KILL_GRACE = 2.0  # seconds a SIGKILLed process may take to die and be reaped
STARTING_GRACE = 30.0
LOOP_STALE = 10.0  # a snapshot older than this: the loop is not running


@dataclass(frozen=True, slots=True)
class Problem:
    """One reason for 503: which node, pool and worker, and why (``reason`` is a code,
    ``detail`` the sentence an operator reads)."""

    node: str
    reason: str  # loop_stalled pool_stalled wedged_busy kill_failed ping_unanswered stuck_starting
    detail: str
    pool: str | None = None
    worker: str | None = None  # "bulk#3"
    pid: int | None = None


@dataclass(frozen=True, slots=True)
class Verdict:
    healthy: bool
    problems: tuple[Problem, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return {
            "status": "ok" if self.healthy else "unhealthy",
            "healthy": self.healthy,
            "problems": [asdict(p) for p in self.problems],
        }


def judge(snap: FleetSnapshot, age: float = 0.0) -> Verdict:
    """The verdict on one supervisor whose snapshot is ``age`` seconds old."""
    problems: list[Problem] = []
    if age > LOOP_STALE:
        problems.append(
            Problem(snap.node_id, "loop_stalled", f"no snapshot for {age:.0f}s: the loop is stuck")
        )
    for pool in snap.pools.values():
        if snap.state == "running":
            problems.extend(_pool_problems(snap.node_id, pool))
        for worker in pool.workers:
            problem = wedged(worker, pool)
            if problem is not None:
                reason, detail = problem
                problems.append(
                    Problem(snap.node_id, reason, detail, pool.name, worker.name, worker.pid)
                )
    return Verdict(not problems, tuple(problems))


def _pool_problems(node: str, pool: PoolView) -> list[Problem]:
    stalled = pool.stalled_for
    if pool.paused or pool.paused_kinds:
        return []
    if stalled is None or stalled <= pool.progress_window:
        return []
    detail = (
        f"{pool.ready} ready job(s), oldest {pool.oldest_age:.0f}s, and no job finished here "
        f"for {stalled:.0f}s (window {pool.progress_window:.0f}s)"
    )
    return [Problem(node, "pool_stalled", detail, pool.name)]


def wedged(w: WorkerView, pool: PoolView) -> tuple[str, str] | None:
    """(reason, detail) when the worker is wedged, else None."""
    if w.killed_for is not None and w.killed_for > KILL_GRACE:
        return "kill_failed", (
            f"SIGKILL ({w.kill}) sent {w.killed_for:.1f}s ago and the process is still there "
            "(uninterruptible sleep?)"
        )
    if w.job is not None and w.elapsed is not None:
        late = w.elapsed - (pool.timeout + pool.soft_timeout + KILL_GRACE)
        if late > 0:
            return "wedged_busy", (
                f"job {w.job} ({w.kind}) has run {w.elapsed:.1f}s, past its timeout of "
                f"{pool.timeout:g}s, and the worker was not stopped"
            )
    # The Ping went to an idle worker; its Pong comes before anything it does with a job sent
    # later, so an overdue Pong means a stuck worker whatever its state is now.
    if w.state != "stopping" and w.ping_wait is not None and w.ping_wait > pool.ping_timeout:
        return "ping_unanswered", (
            f"worker has not answered a ping for {w.ping_wait:.1f}s "
            f"(timeout {pool.ping_timeout:g}s)"
        )
    if w.state == "starting" and w.age > STARTING_GRACE:
        return "stuck_starting", f"forked {w.age:.0f}s ago and never said Ready"
    return None
