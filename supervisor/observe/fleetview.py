"""``FleetView``: the whole fleet as ``fleetd status`` shows it, from the node table and the
store's queue figures. Pure: rows and figures in, a frozen view out (``to_dict`` is the
``--json`` document, whose schema is docs/status.schema.json).

- A node whose heartbeat is older than ``GONE_AFTER`` while its row still says running is
  **gone** (killed, host lost, partitioned), never shown as healthy; its leases expire into
  any node's reaper. Rows of nodes that stopped cleanly long ago, or went missing more than a
  day ago, are counted but not listed.
- Per pool, the figures of live nodes are combined: worker counts, targets, throughput and
  recent events add up; the arrival rate is a fleet-wide figure every node reads from the
  store (the highest is kept); duration and RSS quantiles are the worst node's. The queue
  figures come from the store at the time of the view.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from supervisor.model import Pause, PoolStats, iso
from supervisor.observe import health
from supervisor.observe.schedview import ScheduleSummary, with_errors
from supervisor.observe.snapshot import FleetSnapshot, PoolView, WorkerView

GONE_AFTER = 10.0  # seconds without a heartbeat: gone (the supervisor writes every second)
SHOW_STOPPED_FOR = 600.0
SHOW_GONE_FOR = 86400.0
VIEW_SCHEMA = 1


@dataclass(frozen=True, slots=True)
class NodeView:
    node_id: str
    hostname: str
    pid: int
    fleet: str
    status: str  # running, draining, gone, stopped
    heartbeat_age: float
    started_at: float | None
    snapshot: FleetSnapshot | None
    verdict: health.Verdict

    @property
    def running(self) -> bool:
        """Its row says running or draining, with a fresh heartbeat."""
        return self.status in ("running", "draining")

    @property
    def live(self) -> bool:
        """Running, with a snapshot this release can read."""
        return self.running and self.snapshot is not None


@dataclass(frozen=True, slots=True)
class PoolSummary:
    name: str
    kinds: tuple[str, ...] = ()
    unserved_kinds: tuple[str, ...] = ()  # configured here, handled by no live node
    nodes: int = 0  # live nodes running this pool
    busy: int = 0
    idle: int = 0
    running: int = 0  # jobs running: one per busy slot
    slots: int = 1  # jobs one worker runs at once (the most any node says)
    starting: int = 0
    stopping: int = 0
    target: int = 0
    desired: int = 0
    ceiling: int = 0
    binding: str = "-"
    saturated: bool = False
    draining: bool = False
    paused: bool = False  # fleet-wide (fleetd pause), from the store: nothing of it starts
    paused_kinds: tuple[str, ...] = ()  # kinds paused on their own
    paused_since: str | None = None  # ISO 8601, the oldest pause in force
    rate_limit: float | None = None  # jobs per second, fleet-wide (rate_limit)
    rate_held: bool = False  # ready jobs wait for a rate-limit token on some node
    ready: int | None = None
    scheduled: int | None = None
    leased: int | None = None
    dead: int | None = None
    cancelled: int | None = None
    oldest_age: float = 0.0
    counts_capped: bool = False  # a count reached the store's cap: "at least"
    latency_target: float = 0.0
    age_level: str = "green"  # green, amber, red: oldest age against the latency target
    arrival_rate: float = 0.0
    throughput: float = 0.0
    duration_p50: float | None = None
    duration_p95: float | None = None
    peak_rss_p95: int | None = None
    memory_limit: int | None = None
    timeout: float = 0.0
    recent: dict[str, int] = field(default_factory=dict)
    shared_baseline: int | None = None  # the largest of the nodes' (see PoolView)
    private_at_rest: int | None = None

    @property
    def provisioned(self) -> int:
        return self.busy + self.idle + self.starting + self.stopping


@dataclass(frozen=True, slots=True)
class WorkerRow:
    """A worker with its host, for the per-worker table."""

    node_id: str
    hostname: str
    worker: WorkerView
    memory_limit: int | None


@dataclass(frozen=True, slots=True)
class FleetView:
    taken_at: float  # Unix seconds
    fleet: str
    database: str
    pools: tuple[PoolSummary, ...]
    nodes: tuple[NodeView, ...]
    hidden_nodes: int
    verdict: health.Verdict
    recent_lease_expiries: int = 0
    schedules: tuple[ScheduleSummary, ...] = ()  # supervisor/observe/schedview.py

    @property
    def workers(self) -> list[WorkerRow]:
        """Every live node's workers. A running job's elapsed time is advanced by the age of
        its node's snapshot (written with the heartbeat, about once a second; the age is the
        database's own reckoning, so no two hosts' clocks are compared)."""
        rows = []
        for node in self.nodes:
            if not node.live or node.snapshot is None:
                continue
            lag = max(0.0, node.heartbeat_age)
            for pool in node.snapshot.pools.values():
                for w in pool.workers:
                    if w.elapsed is not None and w.state == "busy":
                        w = replace(w, elapsed=w.elapsed + lag)
                    rows.append(WorkerRow(node.node_id, node.hostname, w, pool.memory_limit))
        return rows

    def to_dict(self) -> dict[str, Any]:
        """The ``fleetd status --json`` document."""
        return {
            "schema": VIEW_SCHEMA,
            "taken_at": iso(self.taken_at),
            "fleet": self.fleet,
            "database": self.database,
            "health": self.verdict.to_dict(),
            "recent_window": 300,
            "recent_lease_expiries": self.recent_lease_expiries,
            "pools": {p.name: {**asdict(p), "provisioned": p.provisioned} for p in self.pools},
            "nodes": [_node_dict(n) for n in self.nodes],
            "hidden_nodes": self.hidden_nodes,
            "schedules": [s.to_dict() for s in self.schedules],
        }


def _node_dict(n: NodeView) -> dict[str, Any]:
    return {
        "node_id": n.node_id,
        "hostname": n.hostname,
        "pid": n.pid,
        "fleet": n.fleet,
        "status": n.status,
        "heartbeat_age": round(n.heartbeat_age, 3),
        "started_at": iso(n.started_at),
        "health": n.verdict.to_dict(),
        "snapshot": n.snapshot.to_dict() if n.snapshot is not None else None,
    }


def node_view(row: Mapping[str, Any]) -> NodeView:
    """One node-table row (``Store.list_nodes``) judged: status, snapshot and health."""
    age = float(row.get("age") or 0.0)
    state = row.get("state") or "running"
    snap = None
    if row.get("snapshot"):
        try:
            snap = FleetSnapshot.from_json(row["snapshot"])
        except (ValueError, TypeError, KeyError):
            snap = None  # a row written by a much older or newer fleetd
    if state == "stopped":
        status = "stopped"
    elif age > GONE_AFTER:
        status = "gone"
    else:
        status = "draining" if state == "draining" else "running"
    if status == "gone":
        verdict = health.Verdict(
            False,
            (
                health.Problem(
                    str(row["node_id"]),
                    "node_gone",
                    f"no heartbeat for {age:.0f}s: the supervisor is gone; its leases expire "
                    "into any other node's reaper",
                ),
            ),
        )
    elif snap is not None and status != "stopped":
        verdict = health.judge(snap, age)
    else:
        verdict = health.Verdict(True)
    return NodeView(
        node_id=str(row["node_id"]),
        hostname=str(row.get("hostname") or "?"),
        pid=int(row.get("pid") or 0),
        fleet=str(row.get("fleet") or "?"),
        status=status,
        heartbeat_age=age,
        started_at=row.get("started_at"),
        snapshot=snap,
        verdict=verdict,
    )


def _shown(node: NodeView) -> bool:
    if node.status == "stopped":
        return node.heartbeat_age <= SHOW_STOPPED_FOR
    if node.status == "gone":
        return node.heartbeat_age <= SHOW_GONE_FOR
    return True


def build_view(
    *,
    fleet: str,
    database: str,
    configured: Mapping[str, Any],
    stats: Mapping[str, PoolStats],
    rows: Iterable[Mapping[str, Any]],
    now: float,
    schedules: tuple[ScheduleSummary, ...] = (),
    pauses: Iterable[Pause] = (),
) -> FleetView:
    """The view: ``configured`` pools (name → PoolConfig) and the store's ``stats`` for them,
    every node row, ``now`` (Unix seconds), the schedules (``schedview.summarize``) and the
    pauses in force (``Store.pauses``)."""
    pauses = tuple(pauses)
    all_nodes = [node_view(r) for r in rows]
    nodes = tuple(sorted((n for n in all_nodes if _shown(n)), key=lambda n: (n.status, n.node_id)))
    live = [n for n in nodes if n.live]
    names = list(configured) + sorted(
        {p for n in live if n.snapshot for p in n.snapshot.pools} - set(configured)
    )
    pools = tuple(
        _paused(_summary(name, configured.get(name), stats.get(name), live), pauses)
        for name in names
    )
    problems = [p for n in nodes for p in n.verdict.problems]
    # a probe of a fleet whose supervisors are all down must not pass; a fresh row counts
    # even before its first snapshot or with one this release cannot read
    if not any(n.running for n in nodes):
        problems.append(
            health.Problem(
                "-",
                "no_live_node",
                "no supervisor using this database is running: nothing will be claimed",
            )
        )
    for pool in pools:
        if pool.ready and pool.nodes == 0:
            problems.append(
                health.Problem(
                    "-",
                    "pool_unserved",
                    f"{pool.ready} ready job(s) and no running supervisor serves this pool",
                    pool.name,
                )
            )
    return FleetView(
        taken_at=now,
        fleet=fleet,
        database=database,
        pools=pools,
        nodes=nodes,
        hidden_nodes=len(all_nodes) - len(nodes),
        verdict=health.Verdict(not problems, tuple(problems)),
        recent_lease_expiries=sum(n.snapshot.recent_lease_expiries for n in live if n.snapshot),
        schedules=with_errors(schedules, schedule_errors(live)),
    )


def _paused(pool: PoolSummary, pauses: tuple[Pause, ...]) -> PoolSummary:
    """The pool with the pauses in force on it (the store's word, not a node's)."""
    mine = [p for p in pauses if p.pool == pool.name]
    if not mine:
        return pool
    whole = any(p.kind is None for p in mine)
    kinds = tuple(sorted({p.kind for p in mine if p.kind is not None}))
    if not whole and pool.kinds and set(pool.kinds) <= set(kinds):
        whole = True  # every kind of it is paused
    return replace(
        pool,
        paused=whole,
        paused_kinds=() if whole else kinds,
        paused_since=iso(min(p.since for p in mine)),
    )


def schedule_errors(nodes: Iterable[NodeView]) -> dict[str, dict[str, str]]:
    """Node id -> schedule -> why its passes do not enqueue it, from live nodes' snapshots."""
    out: dict[str, dict[str, str]] = {}
    for n in nodes:
        if n.live and n.snapshot is not None:
            mine = {name: v.error for name, v in n.snapshot.schedules.items() if v.error}
            if mine:
                out[n.node_id] = mine
    return out


def age_level(oldest: float, target: float) -> str:
    """green below half the latency target, amber below it, red at or past it.

    >>> age_level(10, 300), age_level(200, 300), age_level(300, 300)
    ('green', 'amber', 'red')
    """
    if target <= 0 or oldest < target / 2:
        return "green"
    return "amber" if oldest < target else "red"


def _summary(name: str, config: Any, stats: PoolStats | None, live: list[NodeView]) -> PoolSummary:
    views: list[tuple[NodeView, PoolView]] = [
        (n, n.snapshot.pools[name]) for n in live if n.snapshot and name in n.snapshot.pools
    ]
    pv = [v for _, v in views]
    kinds = tuple(config.handlers) if config is not None else (pv[0].kinds if pv else ())
    served = {k for v in pv for k in v.kinds}
    latency = config.latency_target if config is not None else (pv[0].latency_target if pv else 0)
    fresh = [v for v in pv if v.ready is not None]
    ready = stats.ready if stats else (max(v.ready or 0 for v in fresh) if fresh else None)
    oldest = stats.oldest_ready_age if stats else max((v.oldest_age for v in pv), default=0.0)
    recent: dict[str, int] = {}
    for v in pv:
        for key, n in v.recent.items():
            recent[key] = recent.get(key, 0) + n
    busiest = max(pv, key=lambda v: v.throughput, default=None)
    bindings = {v.binding for v in pv}
    return PoolSummary(
        name=name,
        kinds=kinds,
        unserved_kinds=tuple(k for k in kinds if pv and k not in served) if pv else (),
        nodes=len(pv),
        busy=sum(v.count("busy") for v in pv),
        running=sum(v.running for v in pv),
        slots=max((v.slots for v in pv), default=1),
        idle=sum(v.count("idle") for v in pv),
        starting=sum(v.count("starting") for v in pv),
        stopping=sum(v.count("stopping") for v in pv),
        target=sum(v.target for v in pv),
        desired=sum(v.desired for v in pv),
        ceiling=sum(v.ceiling for v in pv),
        binding=bindings.pop() if len(bindings) == 1 else ("mixed" if bindings else "-"),
        saturated=any(v.saturated for v in pv),
        draining=any(n.status == "draining" for n, _ in views),
        rate_limit=getattr(config, "rate_limit", None) if config is not None else _rate(pv),
        rate_held=bool(ready) and any(v.rate_held for v in pv),
        ready=ready,
        scheduled=stats.scheduled if stats else None,
        leased=stats.leased if stats else None,
        dead=stats.dead if stats else None,
        cancelled=stats.cancelled if stats else None,
        oldest_age=oldest,
        counts_capped=stats.capped if stats else any(v.counts_capped for v in pv),
        latency_target=latency,
        age_level=age_level(oldest, latency) if ready else "green",
        arrival_rate=max((v.arrival_rate for v in pv), default=0.0),
        throughput=sum(v.throughput for v in pv),
        duration_p50=busiest.duration_p50 if busiest else None,
        duration_p95=max((v.duration_p95 for v in pv if v.duration_p95 is not None), default=None),
        peak_rss_p95=max((v.peak_rss_p95 for v in pv if v.peak_rss_p95 is not None), default=None),
        memory_limit=config.memory_limit if config is not None else None,
        timeout=config.timeout if config is not None else (pv[0].timeout if pv else 0.0),
        recent=recent,
        shared_baseline=_largest(v.shared_baseline for v in pv),
        private_at_rest=_largest(v.private_at_rest for v in pv),
    )


def _rate(pv: list[PoolView]) -> float | None:
    """The pool's rate_limit as its nodes report it (the config read here has no such pool)."""
    return pv[0].rate_limit if pv else None


def _largest(values: Any) -> int | None:
    return max((v for v in values if v is not None), default=None)
