"""``fleetd check``: validate a fleet.toml, import its handlers, and describe each pool.

The plan is a plain dict (``--json`` prints it as is); ``render_plan`` makes it readable.
"""

from __future__ import annotations

import os
import select
import shutil
import statistics
import time
from typing import Any

from supervisor import host
from supervisor.clock import SystemClock
from supervisor.config import load_config
from supervisor.config.fleet import FleetConfig
from supervisor.errors import FleetdError
from supervisor.imports import handler_refs, import_handlers
from supervisor.model import iso
from supervisor.policy import KillKind, KillReason, PoolSizing, ceilings
from supervisor.run import memcg, watchdog
from supervisor.run.exits import describe_status
from supervisor.run.forklink import BOOT_LIMIT, ForkerGone, ForkFailed, ForkLink, start_forker
from supervisor.run.pool import Pool
from supervisor.schedules import describe
from supervisor.store import display_url, open_store
from supervisor.units import format_duration, format_rate, format_size
from workers import limits, protocol, tree
from workers.command_rules import CommandSpec


def plan_for(config_path: str) -> dict[str, Any]:
    """Load and validate the config, import every handler, measure a worker of each pool at
    rest, and return the plan."""
    config = load_config(config_path)
    handlers = import_handlers(config)
    cgroup = _cgroup_plan(config)
    cores, memory = host.usable_cores(), host.total_memory()
    budget = config.memory_budget.bytes_of(memory)
    at_rest = measure_all_at_rest(config, handlers)
    shared = {name: m["shared"] for name, m in at_rest.items() if m.get("shared") is not None}
    service = measured_service_times(config)
    sizing = _sizing_plan(config, cores, budget, shared, service)
    return {
        "config": str(config.path),
        "fleet": config.name,
        "database": display_url(config.database),
        "host": {
            "cores": cores,
            "memory": memory,
            "memory_budget": budget,
            "memory_budget_setting": str(config.memory_budget),
        },
        "memory_cgroup": cgroup,
        "pools": {
            name: {
                **_pool_plan(config, name),
                "sizing": sizing[name],
                "memory": _memory_plan(config, name, cgroup),
                "memory_at_rest": at_rest[name],
            }
            for name in config.pools
        },
        "schedules": _schedule_plan(config, SystemClock().now()),
    }


def _schedule_plan(config: FleetConfig, now: float) -> dict[str, dict[str, Any]]:
    """Each schedule's settings and its next three ticks from ``now``."""
    return {
        spec.name: {
            **describe(spec),
            "timing": spec.timing.describe(),
            "policies": spec.policies(),
            "next": [iso(t) for t in spec.timing.next_ticks(now, 3)],
        }
        for spec in config.schedule_specs()
    }


def measure_all_at_rest(
    config: FleetConfig, handlers: dict[str, dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """One worker of each pool at rest, forked as ``fleetd start`` forks them: by a forker
    (workers/forker.py) started for this, so the shared pages measured are the ones a real
    worker shares. The forker is stopped afterwards, taking any worker left with it."""
    try:
        link = start_forker(handlers, handler_refs(config))
    except (OSError, ValueError) as exc:
        return {name: _unmeasured(f"no forker: {exc}") for name in config.pools}
    try:
        try:
            link.await_ready(BOOT_LIMIT)
        except ForkerGone as exc:
            return {name: _unmeasured(str(exc)) for name in config.pools}
        return {name: measure_at_rest(config, name, handlers[name], link) for name in config.pools}
    finally:
        link.close(1.0)


def _unmeasured(error: str) -> dict[str, Any]:
    return {"private": None, "shared": None, "error": error}


def measure_at_rest(
    config: FleetConfig, name: str, handlers: Any, link: ForkLink
) -> dict[str, Any]:
    """Have ``link``'s forker fork one worker of the pool as ``fleetd start`` would, wait for
    its Ready, read its private and shared memory as the kernel counts them
    (``workers.tree.memory_split``), and stop it. A worker that cannot start here (a ``user``
    without root) is reported."""
    pool = Pool(config.pools[name], handlers, os.getpid())
    try:
        worker = link.fork_worker(pool.spec(), now=0.0)
    except (ForkFailed, ForkerGone) as exc:
        return _unmeasured(f"the worker could not be forked: {exc}")
    try:
        ready, _, _ = select.select([worker.fd], [], [], READY_WITHIN)
        worker.sock.setblocking(True)
        msg = protocol.read_frame(worker.fd) if ready else None
        if not isinstance(msg, protocol.Ready):
            status = _exit_status(link, worker.pid) if ready and msg is None else None
            return _unmeasured(not_ready_reason(bool(ready), msg, status))
        split = tree.memory_split(worker.pid)
        if split is None:
            return _unmeasured("no /proc/<pid>/smaps_rollup")
        return {"private": split[0], "shared": split[1], "error": None}
    except OSError as exc:
        return _unmeasured(f"{exc}")
    finally:
        # its pid stays the forker's zombie until the forker is stopped: safe to signal
        worker.kill(KillReason(KillKind.RETIRE, "measured"), 0.0)
        worker.sock.close()


READY_WITHIN = 10.0  # seconds a measuring worker has to boot


def not_ready_reason(ready: bool, msg: Any, status: int | None) -> str:
    """Why a measuring worker sent no Ready: silent, the wrong frame, or how it ended.

    >>> not_ready_reason(False, None, None)
    'the worker did not start: no Ready within 10 s'
    >>> not_ready_reason(True, None, 82 << 8)
    'the worker did not start: exited with code 82 (SETUP_FAILED); its stderr says why'
    """
    if not ready:
        return f"the worker did not start: no Ready within {READY_WITHIN:g} s"
    if msg is not None:
        return f"the worker did not start: it sent {type(msg).__name__} instead of Ready"
    if status is None:
        return "the worker did not start: it closed its socket and did not exit"
    return f"the worker did not start: {describe_status(status)}; its stderr says why"


def _exit_status(link: ForkLink, pid: int, within: float = 2.0) -> int | None:
    """The worker's wait status once its forker relays its end (it closed its socket), or
    None."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        for ended, status in link.take_exits():
            if ended == pid:
                return status
        if link.gone:
            return None
        time.sleep(0.01)
    return None


SERVICE_WINDOW = 300.0  # seconds of recorded durations fleetd check reads for a rate ceiling


def measured_service_times(config: FleetConfig) -> dict[str, dict[str, Any]]:
    """For each pool with a ``rate_limit``: the mean duration of its jobs done in the last
    ``SERVICE_WINDOW`` as the database recorded them, or why there is none. The database is
    only read (not created, not migrated): a queue that does not exist yet has no figure."""
    rated = [p.name for p in config.pools.values() if p.rate_limit is not None]
    if not rated:
        return {}
    try:
        store = open_store(config.database, migrate=False, create=False)
    except FleetdError as exc:
        return {name: {"seconds": None, "jobs": 0, "why": f"database: {exc}"} for name in rated}
    out: dict[str, dict[str, Any]] = {}
    try:
        for name in rated:
            try:
                history = store.history(name, window=SERVICE_WINDOW)
            except FleetdError as exc:
                out[name] = {"seconds": None, "jobs": 0, "why": f"database: {exc}"}
                continue
            durations = history.durations
            out[name] = {
                "seconds": statistics.fmean(durations) if durations else None,
                "jobs": len(durations),
                "why": None if durations else f"no job done in the last {SERVICE_WINDOW:g}s",
            }
    finally:
        store.close()
    return out


def _sizing_plan(
    config: FleetConfig,
    cores: int,
    budget: int,
    shared: dict[str, int] | None = None,
    service: dict[str, dict[str, Any]] | None = None,
) -> dict[str, dict[str, Any]]:
    """Each pool's ceiling on this host and which constraint binds, planned with the
    configured job_memory (the running supervisor switches to the p99 of measured peaks once
    enough jobs have run) less the pool's shared baseline, counted once; with a rate_limit,
    the concurrency it allows at the service time the database recorded (``service``), as
    if this host were the only one."""
    shared, service = shared or {}, service or {}
    pools = [
        PoolSizing(
            p.name,
            p.bound,
            p.min_workers,
            p.max_workers,
            p.job_memory,
            (),
            p.max_inflight,
            shared.get(p.name, 0),
            slots=p.slots,
            rate_limit=p.rate_limit,
            service_time=service.get(p.name, {}).get("seconds"),
            utilization=p.utilization,
        )
        for p in config.pools.values()
    ]
    out = {}
    for name, c in ceilings(pools, cores, budget).items():
        out[name] = {
            "ceiling": c.value,
            "binding": c.binding,
            "max_workers": c.max_workers,
            "cpu": c.cpu,
            "memory": c.memory,
            "memory_share": c.memory_share,
            "peak_per_job": c.peak_per_job,
            "shared": c.shared,
            "per_worker": c.per_worker,
            "max_inflight": c.max_inflight,
            "latency_target": config.pools[name].latency_target,
            "slots": config.pools[name].slots,
            "rate": c.rate,
            "rate_limit": config.pools[name].rate_limit,
            "utilization": config.pools[name].utilization,
            "service_time": service.get(name),
        }
    return out


def _cgroup_plan(config: FleetConfig) -> dict[str, Any]:
    """Which cgroup memory mechanism ``fleetd start`` would use here (detected now, by this
    process: run check as the user and in the cgroup fleetd runs in)."""
    if not config.memory_cgroup:
        found = host.MemoryCgroup("none", None, "memory_cgroup = false in fleet.toml")
    else:
        found = host.memory_cgroup()
    path = str(found.path) if found.path is not None else None
    return {"mechanism": found.mechanism, "path": path, "reason": found.reason}


def _memory_plan(config: FleetConfig, name: str, cgroup: dict[str, Any]) -> dict[str, Any]:
    """The mechanisms that enforce the pool's memory_limit: each None when not active."""
    limit = config.pools[name].memory_limit
    if limit is None:
        return {"rlimit": None, "watchdog": None, "cgroup": None}
    slots = config.pools[name].slots
    stacks = limits.slot_stacks(slots) if slots > 1 else 0  # its threads' stacks
    return {
        # the worker adds the VmData-RSS gap it inherited at fork (workers.limits)
        "rlimit": {"resource": "RLIMIT_DATA", "value": limit + limits.DEFAULT_HEADROOM + stacks},
        "watchdog": {"measure": "worker RSS", "period": watchdog.PERIOD},
        "cgroup": None
        if cgroup["mechanism"] == "none"
        else {"mechanism": cgroup["mechanism"], "limit": memcg.cgroup_limit(limit)},
    }


def _pool_plan(config: FleetConfig, name: str) -> dict[str, Any]:
    pool = config.pools[name]
    return {
        "kinds": list(pool.kinds),
        "min_workers": pool.min_workers,
        "max_workers": pool.max_workers,
        "bound": pool.bound,
        "slots": pool.slots,
        "memory_limit": pool.memory_limit,
        "timeout": pool.timeout,
        "lease": pool.lease,
        "heartbeat": pool.heartbeat,
        "max_deliveries": pool.max_deliveries,
        "order": _order_plan(pool),
        "commands": _command_plan(pool.handlers),
    }


def _order_plan(pool: Any) -> dict[str, Any]:
    """Which order the pool's claims take (supervisor/store/fair.py): ``fair`` between
    tenants (always with caps) or strict ``fifo``; the weights; whether the claim is serialised
    per pool (capped: always; fair: while more than one tenant is queued)."""
    capped = bool(pool.max_inflight or pool.tenant_max_inflight or pool.kind_max_inflight)
    return {
        "order": "fair" if pool.fair or capped else "fifo",
        "weights": dict(pool.tenant_weights),
        "capped": capped,
    }


def _command_plan(handlers: Any) -> dict[str, dict[str, Any]]:
    """Each command kind's argv and where its program is found on PATH (None: not found;
    its jobs would fail until it is installed). PATH is this process's: run check in the
    environment fleetd starts in."""
    return {
        kind: {"command": list(spec.argv), "program": shutil.which(spec.program)}
        for kind, spec in handlers.items()
        if isinstance(spec, CommandSpec)
    }


def render_plan(plan: dict[str, Any]) -> str:
    """The plan as a few lines per pool."""
    lines = [f"{plan['config']}: OK (fleet {plan['fleet']!r}, database {plan['database']})"]
    h, cg = plan["host"], plan["memory_cgroup"]
    lines.append(
        f"  host: {h['cores']} cores, {format_size(h['memory'])} memory; memory_budget "
        f"{h['memory_budget_setting']} = {format_size(h['memory_budget'])}"
    )
    lines.append(f"  memory cgroups: {cg['mechanism']} ({cg['reason']})")
    for name, p in plan["pools"].items():
        limit = format_size(p["memory_limit"]) if p["memory_limit"] else "none"
        lines.append(
            f"  pool {name}: kinds {', '.join(p['kinds'])}; workers {p['min_workers']}.."
            f"{p['max_workers']} ({p['bound']}{_slots(p.get('slots', 1))}); memory_limit {limit}; "
            f"timeout {format_duration(p['timeout'])}; lease {format_duration(p['lease'])} "
            f"(heartbeat {format_duration(p['heartbeat'])}); max_deliveries {p['max_deliveries']}"
        )
        lines.append(f"    order: {_render_order(p['order'])}")
        lines.append(f"    sizing: {_render_sizing(p['sizing'])}")
        lines.append(f"    memory: {_render_memory(p['memory'])}")
        lines.append(f"    at rest: {_render_at_rest(p['memory_at_rest'], p['sizing'])}")
        for kind, c in p.get("commands", {}).items():
            found = f"found at {c['program']}" if c["program"] else "NOT FOUND on PATH"
            lines.append(f"    command {kind}: {c['command'][0]} {found}")
    for name, s in plan.get("schedules", {}).items():
        lines.append(
            f"  schedule {name}: {s['kind']} (pool {s['pool']}) {s['timing']}; {s['policies']}"
        )
        lines.append(f"    next: {', '.join(s['next']) or 'never'}")
    return "\n".join(lines)


def _slots(slots: int) -> str:
    """``, 20 slots each`` for a pool whose workers run several jobs; nothing otherwise."""
    return f", {slots} slots each" if slots > 1 else ""


def _render_order(o: dict[str, Any]) -> str:
    if o["order"] == "fifo":
        return "priority, then FIFO, whatever the tenant (fair = false)"
    weights = ", ".join(f"{t or '(no tenant)'} {w:g}" for t, w in o["weights"].items())
    weighted = f"weights {weights}, others 1" if weights else "equal weights"
    how = (
        "every claim, one at a time per pool: caps"
        if o["capped"]
        else "one claim at a time per pool while more than one tenant is queued; else plain"
    )
    return f"fair share between tenants, {weighted} ({how})"


def _render_sizing(s: dict[str, Any]) -> str:
    cpu = "cpu -" if s["cpu"] is None else f"cpu {s['cpu']}"
    inflight = "-" if s["max_inflight"] is None else s["max_inflight"]
    slots = s.get("slots", 1)
    if slots > 1 and s["max_inflight"] is not None:  # a cap counts jobs, a ceiling workers
        inflight = f"{inflight} jobs = {-(-s['max_inflight'] // slots)} workers"
    return (
        f"ceiling {s['ceiling']} (bound by {s['binding']}): max_workers {s['max_workers']}, "
        f"{cpu}, memory {s['memory']} ({_memory_ceiling(s)}), max_inflight {inflight}"
        f"{_rate_ceiling(s)}; scales on oldest-job age, target "
        f"{format_duration(s['latency_target'])}"
    )


def _rate_ceiling(s: dict[str, Any]) -> str:
    """``, rate 15 (50/s × 200ms measured over 120 jobs / utilization 0.7)``, or why there
    is no figure yet; nothing for a pool without a rate_limit."""
    if s.get("rate_limit") is None:
        return ""
    limit = format_rate(s["rate_limit"])
    measured = s.get("service_time") or {}
    if s.get("rate") is None:
        why = measured.get("why") or "no service time measured"
        return f", rate - ({limit}: {why}; the supervisor's scaler measures it as jobs finish)"
    return (
        f", rate {s['rate']} ({limit} × {format_duration(measured['seconds'])} mean service "
        f"time of {measured['jobs']} jobs / utilization {s['utilization']:g})"
    )


def _memory_ceiling(s: dict[str, Any]) -> str:
    """``5.7GiB / 200MiB per job``, or with a shared baseline, ``(5.7GiB - 24MiB shared) /
    176MiB a worker (200MiB per job less the shared)``."""
    slots = s.get("slots", 1)
    # a worker of N slots is planned at N jobs' peak (memory is per worker)
    per = "per job" if slots == 1 else f"per worker of {slots} jobs"
    if not s.get("shared"):
        return f"{format_size(s['memory_share'])} / {format_size(s['peak_per_job'])} {per}"
    return (
        f"({format_size(s['memory_share'])} - {format_size(s['shared'])} shared) / "
        f"{format_size(s['per_worker'])} a worker ({format_size(s['peak_per_job'])} {per} "
        "less the shared)"
    )


def _render_at_rest(m: dict[str, Any], sizing: dict[str, Any]) -> str:
    if m["private"] is None:
        return f"not measured ({m['error']})"
    return (
        f"a worker {format_size(m['private'])} private + {format_size(m['shared'])} shared "
        f"(smaps of one forked worker); the ceiling counts the shared part once and "
        f"{format_size(sizing['per_worker'])} a worker"
    )


def _render_memory(m: dict[str, Any]) -> str:
    if m["rlimit"] is None:
        return "no memory_limit: no rlimit, no RSS watchdog, no cgroup"
    r, w, c = m["rlimit"], m["watchdog"], m["cgroup"]
    cgroup = f"cgroup {c['mechanism']} at {format_size(c['limit'])}" if c else "no cgroup"
    return (
        f"{r['resource']} {format_size(r['value'])} (+ the VmData-RSS gap at fork); "
        f"RSS watchdog every {format_duration(w['period'])}; {cgroup}"
    )
