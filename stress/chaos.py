"""Chaos: real supervisors, a hostile job mix, and faults on a seeded schedule; then every
invariant checked from the store, the supervisors' logs and the handlers' execution log.

What it does:

1. Writes a fleet.toml with four pools: ``interactive`` (no-ops and 1-3 ms burns),
   ``bulk`` (CPU burns, memory hogs, leaks with ``recycle_rss``, flaky jobs, jobs that ignore
   SIGTERM), ``downstream`` (slow calls behind a file-lock semaphore of 2 slots, with
   ``max_inflight = 2`` fleet-wide) and ``poison`` (gradual and instant memory bombs, hangs,
   crashes by exit code, SIGSEGV and SIGKILL of itself, and a fork bomb: that pool runs as an
   unprivileged user with ``nproc_limit``). Every pool has a short lease (3 s) so the jobs of a
   SIGKILLed supervisor come back quickly. Supervisors log JSON, so every failed delivery is a
   record with node, job, attempt and error kind.
2. Starts ``--supervisors`` supervisors (``python -m supervisor start``, subprocesses) and
   feeds ``--jobs`` jobs over the first 80% of ``--duration``: normal jobs with poison ones
   among them (the payload says so: ``"poison": "<expected error kind>"``).
3. Meanwhile, on a schedule drawn from ``--seed``: SIGKILLs busy workers (children of a
   supervisor, found with psutil; the process title names the job), SIGKILLs a supervisor and
   restarts it under a new node id, drains one with SIGTERM and starts its replacement once it
   exited (a rolling deploy), and lets an extra supervisor join and later leave (SIGTERM).
   With ``--allow-db-restart`` (PostgreSQL on this host only) it also restarts the database
   server (``stress/chaos_db.py``) and waits until it accepts connections again.
4. When every job is done or dead (or at ``--duration`` plus a tail), stops everything and
   checks (``stress/chaos_checks.py`` says how each fault is told apart from a bug): nothing
   lost; exactly the poison jobs dead, each of its expected error kind after max_deliveries;
   no normal job dead or failed for a reason no fault explains; duplicates only where a kill
   made them possible; drains released their jobs; the downstream cap held; no process left.

Exit status: 0 when every invariant held, 1 on any violation, 2 on a usage error. The run's
folder (config, database, logs, execution log, the harness's event log) is kept when a check
failed or with ``--keep``.

Examples::

    python -m stress chaos --short                         # ~45 s, SQLite
    python -m stress chaos --short --database postgres     # a fresh schema, dropped after
    python -m stress chaos --jobs 20000 --duration 900     # the long run
    python -m stress chaos --short --database postgres --allow-db-restart
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import psutil
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from stress import chaos_db
from stress.chaos_checks import (
    DbRestart,
    Evidence,
    LeaseEvent,
    LoggedFailure,
    NodeRun,
    PlannedJob,
    Report,
    WorkerKill,
    check,
)
from stress.chaos_stall import Staller
from supervisor.model import JobState

T = TypeVar("T")
HELP = "faults on a seeded schedule against real supervisors; invariants checked at the end"
ROOT = Path(__file__).resolve().parents[1]
FIX = "stress.fixtures:"
LEASE = "3s"
GRACE = 2.0
NPROC_LIMIT = 48
BOMB_WAIT = 30.0  # s a supervisor kill waits for a fork bomb to be running on its target
BOOT_WAIT = 30.0  # s the final stop waits for supervisors still booting
POISON_DELIVERIES = 3
NORMAL_DELIVERIES = 5
DOWNSTREAM_SLOTS = 2
RETRY_FOR = 30.0  # s the harness retries its own store calls while the store is unavailable

# pool -> (handlers: kind -> fixture, keys)
POOLS: dict[str, tuple[dict[str, str], dict[str, Any]]] = {
    "interactive": (
        {"ping": "noop", "quick": "burn"},
        {"min_workers": 1, "max_workers": 2, "bound": "io", "timeout": "10s"},
    ),
    "bulk": (
        {"crunch": "burn", "hog": "hog", "leak": "leak", "flaky": "flaky", "stubborn": "stubborn"},
        {
            "min_workers": 1,
            "max_workers": 2,
            "bound": "cpu",
            "memory_limit": "384MiB",
            "job_memory": "100MiB",
            "recycle_rss": "192MiB",
            "timeout": "10s",
        },
    ),
    "downstream": (
        {"call": "downstream"},
        {
            "min_workers": 1,
            "max_workers": 3,
            "bound": "io",
            "max_inflight": DOWNSTREAM_SLOTS,
            "timeout": "10s",
        },
    ),
    "poison": (
        {
            "gradual_bomb": "gradual_bomb",
            "instant_bomb": "instant_bomb",
            "hang": "hang",
            "crash_exit": "crash_exit",
            "crash_segv": "crash_segv",
            "crash_sigkill": "crash_sigkill",
            "fork_bomb": "fork_bomb",
        },
        {
            "min_workers": 1,
            "max_workers": 2,
            "bound": "io",
            "memory_limit": "200MiB",
            "job_memory": "64MiB",
            "timeout": "2s",
            "max_deliveries": POISON_DELIVERIES,
            "retry_backoff": "200ms",
            "retry_backoff_max": "1s",
        },
    ),
}
COMMON = {
    "lease": LEASE,
    "max_deliveries": NORMAL_DELIVERIES,
    "retry_backoff": "200ms",
    "retry_backoff_max": "2s",
    "latency_target": "10s",
    "scale_in_cooldown": "10s",
}

# the poison kinds, each with its payload and the error kind it must die of
POISON: list[tuple[str, dict[str, Any], str]] = [
    ("gradual_bomb", {"chunk_mib": 25, "interval": 0.02}, "memory_limit"),
    ("instant_bomb", {"gib": 8}, "memory_limit"),
    ("hang", {}, "timeout"),
    ("crash_exit", {"code": 3}, "crashed"),
    ("crash_segv", {}, "crashed"),
    ("crash_sigkill", {}, "crashed"),
    ("fork_bomb", {"hold": 8, "nap": 0.01}, "timeout"),
]


# ---- settings ---------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, default=1, help="the schedule and the mix (default 1)")
    parser.add_argument("--jobs", type=int, help="jobs to enqueue (default 20000; --short 300)")
    parser.add_argument(
        "--duration",
        type=float,
        help="seconds over which jobs are fed and faults injected (default 900; --short 30)",
    )
    parser.add_argument(
        "--database",
        default="sqlite",
        help="sqlite (a file in the run's folder), postgres (a fresh schema on "
        "$FLEETD_TEST_POSTGRES_URL, dropped after) or a SQLAlchemy URL of an empty database",
    )
    parser.add_argument("--supervisors", type=int, default=2, help="supervisors kept running")
    parser.add_argument("--short", action="store_true", help="a few hundred jobs, ~30-60 s")
    parser.add_argument("--worker-kills", type=int, help="workers to SIGKILL (default duration/15)")
    parser.add_argument("--supervisor-kills", type=int, help="supervisors to SIGKILL (default 6)")
    parser.add_argument("--drains", type=int, help="rolling-deploy drains (default 12)")
    parser.add_argument("--joins", type=int, help="extra supervisors joining, then leaving")
    parser.add_argument(
        "--allow-db-restart",
        action="store_true",
        help="also restart the PostgreSQL server (local only, pg_ctlcluster; needs "
        "--database postgres or a postgresql:// URL)",
    )
    parser.add_argument(
        "--db-restarts",
        type=int,
        help="with --allow-db-restart: server restarts (default max(2, duration/300); --short 1)",
    )
    parser.add_argument(
        "--stalls",
        type=int,
        help="database stalls of 1-6 s, connections kept open (a proxy on PostgreSQL, a "
        "process holding the write lock on SQLite; default duration/120, at least 2; --short 1)",
    )
    parser.add_argument(
        "--poison-share", type=float, help="share of poison jobs (default 0.015; --short 0.08)"
    )
    parser.add_argument("--bomb-user", default="nobody", help="the poison pool's user (root only)")
    parser.add_argument("--folder", type=Path, help="the run's folder (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the run's folder")
    parser.add_argument("--json", type=Path, help="write every figure and violation here")
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("FLEETD_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1/test"),
        help="the server --database postgres makes its schema on",
    )


@dataclass
class Settings:
    seed: int
    jobs: int
    duration: float
    supervisors: int
    worker_kills: int
    supervisor_kills: int
    drains: int
    joins: int
    db_restarts: int
    stalls: int
    poison_share: float
    bomb_user: str | None
    database: str
    short: bool

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Settings:
        short = bool(args.short)
        duration = args.duration or (30.0 if short else 900.0)

        def pick(value: int | None, short_default: int, long_default: int) -> int:
            return value if value is not None else (short_default if short else long_default)

        bomb_user = args.bomb_user if os.geteuid() == 0 else None
        return cls(
            seed=args.seed,
            jobs=pick(args.jobs, 300, 20_000),
            duration=duration,
            supervisors=max(1, args.supervisors),
            worker_kills=pick(args.worker_kills, 3, max(50, int(duration / 15))),
            supervisor_kills=pick(args.supervisor_kills, 1, 6),
            drains=pick(args.drains, 1, 12),
            joins=pick(args.joins, 1, 3),
            db_restarts=(
                pick(args.db_restarts, 1, max(2, round(duration / 300)))
                if args.allow_db_restart
                else 0
            ),
            stalls=max(0, pick(args.stalls, 1, max(2, round(duration / 120)))),
            poison_share=args.poison_share or (0.08 if short else 0.015),
            bomb_user=bomb_user,
            database=args.database,
            short=short,
        )

    @property
    def tail(self) -> float:
        """How long after ``duration`` the run waits for the last jobs before giving up."""
        return max(60.0, 0.3 * self.duration)


# ---- the job mix ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Item:
    kind: str
    pool: str
    payload: dict[str, Any]
    expect: str | None = None


def plan_jobs(s: Settings, rng: random.Random, log: Path, lock_dir: Path) -> list[Item]:
    """The mix, in enqueue order: poison kinds in turn (each at least once), the rest normal."""
    pool_of = {kind: pool for pool, (handlers, _) in POOLS.items() for kind in handlers}
    poison_kinds = [p for p in POISON if s.bomb_user or p[0] != "fork_bomb"]
    n_poison = max(len(poison_kinds), round(s.jobs * s.poison_share))
    normal: list[tuple[int, str, Any]] = [
        (30, "ping", lambda: {}),
        (10, "quick", lambda: {"ms": rng.randint(1, 3)}),
        (15, "crunch", lambda: {"ms": rng.randint(5, 20)}),
        (5, "hog", lambda: {"mib": rng.randint(10, 60), "ms": rng.randint(10, 80)}),
        (5, "leak", lambda: {"mib": 2}),
        (4, "flaky", lambda: {"succeed_on": rng.randint(2, 3)}),
        (
            8,
            "call",
            lambda: {
                "seconds": round(rng.uniform(0.02, 0.08), 3),
                "slots": DOWNSTREAM_SLOTS,
                "lock_dir": str(lock_dir),
            },
        ),
        (1, "stubborn", lambda: {"seconds": round(rng.uniform(0.5, 3.0), 2)}),
    ]
    weights = [w for w, _, _ in normal]
    items: list[Item] = []
    for n in range(s.jobs - n_poison):
        _, kind, make = rng.choices(normal, weights)[0]
        items.append(Item(kind, pool_of[kind], {"log": str(log), "n": n, **make()}))
    for n in range(n_poison):
        kind, payload, expect = poison_kinds[n % len(poison_kinds)]
        body = {"log": str(log), "poison": expect, **payload}
        items.insert(rng.randrange(len(items) + 1), Item(kind, "poison", body, expect))
    return items


# ---- the fleet --------------------------------------------------------------------------


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str | Path):
        return json.dumps(str(value))
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return (
            "{ " + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
        )
    raise TypeError(f"no TOML for {value!r}")


def write_config(folder: Path, url: str, s: Settings) -> Path:
    lines = [
        "[fleet]",
        f"name = {toml_value('chaos')}",
        f"database = {toml_value(url)}",
        f"python_path = {toml_value([str(ROOT)])}",
        f'grace_period = "{GRACE}s"',
        'log_format = "json"',
        "",
    ]
    for pool, (handlers, keys) in POOLS.items():
        settings = {**COMMON, **keys}
        table = {kind: FIX + fixture for kind, fixture in handlers.items()}
        if pool == "poison":
            if s.bomb_user:
                settings.update(user=s.bomb_user, nproc_limit=NPROC_LIMIT)
            else:
                table.pop("fork_bomb")
        lines += [f"[pools.{pool}]", f"handlers = {toml_value(table)}"]
        lines += [f"{k} = {toml_value(v)}" for k, v in settings.items()]
        lines.append("")
    path = folder / "fleet.toml"
    path.write_text("\n".join(lines))
    return path


SUPERVISOR = [sys.executable, "-m", "supervisor", "start"]
_TITLE = re.compile(r"fleetd: (\w+)#\d+ (?:job=(\d+) (\S+)|idle)")


def alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class Node:
    """One supervisor process and every descendant it was seen with."""

    def __init__(self, name: str, role: str, config: Path, logs: Path) -> None:
        self.name = name
        self.role = role
        self.config = config
        self.log_path = logs / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.ps: psutil.Process | None = None
        self.seen: dict[int, psutil.Process] = {}
        self.lock = threading.Lock()
        self.run: NodeRun | None = None
        self.started_mono = 0.0
        self.is_booted = False

    def start(self) -> Node:
        # the supervisors run the code of the tree this harness runs from (a worktree pinned
        # at a commit, say), not whatever an editable install points at
        path = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [*SUPERVISOR, "-c", str(self.config), "--node-id", self.name],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.config.parent,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(path)},
                start_new_session=True,
            )
        self.ps = psutil.Process(self.proc.pid)
        self.started_mono = time.monotonic()
        self.run = NodeRun(self.name, self.role, self.proc.pid, time.time())
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def up_for(self) -> float:
        return time.monotonic() - self.started_mono

    def booted(self) -> bool:
        """Its log says it started (it reached the database, registered, forked)."""
        if not self.is_booted:
            line = f"fleetd supervisor {self.name} started".encode()
            with contextlib.suppress(FileNotFoundError), open(self.log_path, "rb") as f:
                self.is_booted = line in f.read(1 << 16)  # among its first lines
        return self.is_booted

    def track(self) -> list[psutil.Process]:
        """Record the descendants now; return them."""
        if self.ps is None or not self.running():
            return []
        try:
            children = self.ps.children(recursive=True)
        except psutil.Error:
            return []
        with self.lock:
            for c in children:
                self.seen.setdefault(c.pid, c)
        return children

    def workers(self) -> list[tuple[psutil.Process, str, int | None, str | None]]:
        """Its worker processes now: (process, pool, job id and kind, or None when idle)."""
        if self.ps is None:
            return []
        out = []
        try:  # its forker's children (workers/forker.py), or its own once a forker died
            children = self.ps.children()
            for forker in [c for c in children if c.name() == "fleetd: forker"]:
                children += forker.children()
        except psutil.Error:
            return []
        for child in children:
            try:
                title = " ".join(child.cmdline())
            except psutil.Error:
                continue
            m = _TITLE.match(title)
            if m:
                out.append((child, m[1], int(m[2]) if m[2] else None, m[3]))
        return out

    def signal(self, sig: int, how: str) -> None:
        assert self.run is not None
        self.track()
        self.run.signalled = time.time()
        self.run.how = how
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, sig)

    def reaped(self) -> bool:
        """True once it exited (recording when and how)."""
        assert self.proc is not None and self.run is not None
        code = self.proc.poll()
        if code is None:
            return False
        if self.run.exited is None:
            self.run.exited = time.time()
            self.run.exit_code = code
        return True

    def alive_seen(self) -> list[psutil.Process]:
        with self.lock:
            seen = list(self.seen.values())
        return [p for p in seen if alive(p)]


class Sampler(threading.Thread):
    """Records every node's descendants every 0.25 s, and the bomb user's process count."""

    def __init__(self, nodes: list[Node], bomb_uid: int | None) -> None:
        super().__init__(daemon=True, name="chaos-sampler")
        self.nodes = nodes
        self.bomb_uid = bomb_uid
        self.bomb_max = 0
        self.stop = threading.Event()

    def run(self) -> None:
        tick = 0
        while not self.stop.wait(0.25):
            for node in list(self.nodes):
                node.track()
            tick += 1
            if self.bomb_uid is not None and tick % 2 == 0:
                self.bomb_max = max(self.bomb_max, count_user(self.bomb_uid))


def in_cgroup_of(supervisor: int) -> dict[int, psutil.Process]:
    """Live processes in the memory cgroups of the supervisor with that pid (fleetd puts
    each worker in ``.../fleetd-<supervisor pid>/<pool>-<slot>-<pid>``; the processes its job
    starts are born there). Empty where fleetd runs without cgroups."""
    mark = f"/fleetd-{supervisor}/"
    found = {}
    for proc in psutil.process_iter():
        try:
            with open(f"/proc/{proc.pid}/cgroup") as f:
                if mark in f.read() and alive(proc):
                    found[proc.pid] = proc
        except OSError:
            continue
    return found


def count_user(uid: int) -> int:
    n = 0
    for p in psutil.process_iter(["uids"]):
        uids = p.info.get("uids")
        if uids is not None and uids.real == uid:
            n += 1
    return n


# ---- the run ----------------------------------------------------------------------------


@dataclass(order=True)
class Event:
    at: float  # seconds since the start
    what: str = field(compare=False)
    target: Any = field(default=None, compare=False)


class Chaos:
    def __init__(
        self,
        s: Settings,
        folder: Path,
        url: str,
        console: Console,
        cluster: chaos_db.Cluster | None = None,
        staller: Staller | None = None,
    ) -> None:
        self.s = s
        self.cluster = cluster  # the PostgreSQL server the db_restart fault restarts
        self.staller = staller  # stalls the database for the supervisors
        self.folder = folder
        self.url = url
        self.console = console
        self.rng = random.Random(s.seed)
        self.logs = folder / "logs"
        self.logs.mkdir()
        self.exec_log = folder / "executions.jsonl"
        self.lock_dir = folder / "locks"
        self.lock_dir.mkdir()
        self.events_path = folder / "chaos-events.jsonl"
        # workers running as the bomb user must reach the execution log and the lock folder
        for path in (folder, self.logs, self.lock_dir):
            path.chmod(0o755)
        self.exec_log.touch()
        self.exec_log.chmod(0o666)
        # supervisors reach the database the way a stall can hit them (through the proxy)
        self.config = write_config(folder, staller.supervisor_url if staller else url, s)
        self.nodes: list[Node] = []
        self.slots: dict[int, Node | None] = {}
        self.generation: dict[int, int] = {}
        self.guests = 0
        self.kills: list[WorkerKill] = []
        self.orphans: dict[int, psutil.Process] = {}
        self.orphans_late: dict[int, psutil.Process] = {}
        self.pending: list[Event] = []
        self.restarts: list[tuple[float, int]] = []  # (at, slot)
        self.draining: list[Node] = []
        self.timed_out = False
        self.bomb_uid = pwd.getpwnam(s.bomb_user).pw_uid if s.bomb_user else None
        self.sampler = Sampler(self.nodes, self.bomb_uid)
        self.plan: dict[int, PlannedJob] = {}
        self.left: list[str] = []
        self.most_running = 0
        self.skipped: Counter[str] = Counter()
        self.db_restarts: list[DbRestart] = []
        self.stalls: list[DbRestart] = []
        self.t0 = 0.0

    # -- bookkeeping --

    def note(self, what: str, **fields: Any) -> None:
        line = {"t": round(time.time(), 3), "at": round(self.elapsed(), 2), "what": what, **fields}
        with open(self.events_path, "a") as f:
            f.write(json.dumps(line) + "\n")
        if what not in ("fed",):
            detail = " ".join(f"{k}={v}" for k, v in fields.items())
            self.console.log(f"[bold]{what}[/] {detail}")

    def elapsed(self) -> float:
        return time.monotonic() - self.t0 if self.t0 else 0.0

    def start_node(self, slot: int | None) -> Node:
        if slot is None:
            self.guests += 1
            name, role = f"guest-{self.guests}", "guest"
        else:
            self.generation[slot] = self.generation.get(slot, 0) + 1
            name, role = f"s{slot}-{self.generation[slot]}", "base"
        node = Node(name, role, self.config, self.logs).start()
        self.nodes.append(node)
        if slot is not None:
            self.slots[slot] = node
        self.note("start", node=name, pid=node.pid)
        return node

    def live(self, role: str | None = None) -> list[Node]:
        return [
            n
            for n in self.nodes
            if n.running() and n.run and n.run.how is None and (role is None or n.role == role)
        ]

    def leased_by(self, store: Any, name: str) -> list[int]:
        return [j.id for j in _all_jobs(store, JobState.LEASED) if j.owner == name]

    # -- the schedule --

    def schedule(self) -> None:
        d = self.s.duration

        def times(n: int) -> list[float]:
            return [self.rng.uniform(0.05 * d, 0.75 * d) for _ in range(n)]  # while fed

        for what, n in (
            ("worker_kill", self.s.worker_kills),
            ("supervisor_kill", self.s.supervisor_kills),
            ("drain", self.s.drains),
            ("join", self.s.joins),
            ("db_restart", self.s.db_restarts if self.cluster else 0),
            ("stall", self.s.stalls if self.staller else 0),
        ):
            self.pending += [Event(t, what) for t in times(n)]
        self.pending.sort()

    def fault(self, ev: Event, store: Any) -> bool:
        """Try to inject one fault; False: not possible now, try again later."""
        supervisor_level = ev.what in ("supervisor_kill", "drain", "join", "db_restart")
        if supervisor_level and (self.restarts or self.draining):
            return False  # one supervisor-level change at a time
        if ev.what == "worker_kill":
            return self.kill_worker()
        if ev.what == "db_restart":
            return self.restart_database(store)
        if ev.what == "stall":
            assert self.staller is not None
            if self.staller.active:
                return False  # one at a time
            seconds = round(self.rng.uniform(1.0, 6.0), 2)
            try:
                self.staller.begin(seconds)
            except RuntimeError as exc:  # no stall happened: none is recorded
                self.note("stall_failed", why=str(exc))
                return True
            self.note("stall", seconds=seconds)
            return True
        if ev.what == "supervisor_kill":
            targets = [n for n in self.live("base") if n.up_for() > 2.0]
            # the worst moment: while a fork bomb runs, whose processes PDEATHSIG does not
            # reach (waited for up to BOMB_WAIT seconds, then any moment will do)
            bombing = [n for n in targets if any(w[3] == "fork_bomb" for w in n.workers())]
            if bombing:
                targets = bombing
            elif self.elapsed() - ev.at < BOMB_WAIT and self.bomb_uid is not None:
                return False
            if not targets:
                return False
            node = self.rng.choice(targets)
            before = {p.pid: p for p in node.track()}
            node.signal(signal.SIGKILL, "kill")
            assert node.run is not None
            node.run.held = tuple(self.leased_by(store, node.name))
            slot = next(k for k, v in self.slots.items() if v is node)
            self.restarts.append((self.elapsed() + self.rng.uniform(0.5, 2.0), slot))
            self.note("supervisor_kill", node=node.name, pid=node.pid, held=len(node.run.held))
            self.pending.append(Event(self.elapsed() + 1.5, "orphans", (node.pid, before)))
            self.pending.append(Event(self.elapsed() + 6.0, "orphans_late", (node.pid, before)))
            return True
        if ev.what in ("drain", "leave"):
            # a SIGTERM before the supervisor's handlers are in place ends it with -15: wait
            # for its boot (which took over 4 s on a loaded machine)
            if ev.what == "leave":
                node = ev.target
                if node.running() and not node.booted():
                    return False
            else:
                targets = [n for n in self.live("base") if n.up_for() > 3.0 and n.booted()]
                if not targets:
                    return False
                node = self.rng.choice(targets)
            if not node.running():
                return True
            node.signal(signal.SIGTERM, ev.what)
            self.draining.append(node)
            self.note(ev.what, node=node.name, pid=node.pid)
            return True
        if ev.what == "join":
            if self.staller is not None and self.staller.active:
                return False  # a PostgreSQL supervisor cannot boot through a stall (5 s)
            guest = self.start_node(None)
            stay = self.rng.uniform(0.08, 0.15) * self.s.duration
            self.pending.append(Event(self.elapsed() + max(stay, 6.0), "leave", guest))
            return True
        if ev.what in ("orphans", "orphans_late"):
            # a job's own processes outliving its SIGKILLed supervisor: 1.5 s after the kill,
            # and 6 s after (once its replacement has booted and swept stale cgroups)
            pid, before = ev.target
            left = {p.pid: p for p in before.values() if alive(p)}
            left.update(in_cgroup_of(pid))  # also those forked after the kill's snapshot
            (self.orphans if ev.what == "orphans" else self.orphans_late).update(left)
            if left:
                self.note(ev.what, count=len(left))
            return True
        raise AssertionError(ev.what)

    def kill_worker(self) -> bool:
        nodes = [n for n in self.live() if n.up_for() > 1.0]
        candidates = [(n, w) for n in nodes for w in n.workers()]
        # never the same job twice: the harness alone could kill it to death (a normal job
        # dead after max_deliveries of kills would be the harness's doing, not fleetd's)
        killed = {k.job for k in self.kills}
        busy = [(n, w) for n, w in candidates if w[2] is not None and w[2] not in killed]
        if not busy:
            return False
        # a pool first, then one of its busy workers: at any instant most busy workers run
        # long poison jobs, and a kill should reach every kind of job
        pool = self.rng.choice(sorted({w[1] for _, w in busy}))
        node, (proc, pool, job, _) = self.rng.choice([(n, w) for n, w in busy if w[1] == pool])
        with contextlib.suppress(psutil.Error):
            at = time.time()  # before the signal: the supervisor may log the crash at once
            proc.send_signal(signal.SIGKILL)
            self.kills.append(WorkerKill(at, node.name, proc.pid, pool, job))
            self.note("worker_kill", node=node.name, pid=proc.pid, pool=pool, job=job)
        return True

    def restart_database(self, store: Any) -> bool:
        """Restart the PostgreSQL server once every live supervisor has booted (one that
        cannot reach the database at start exits: a deploy's problem, not the one tested
        here). The harness's own calls retry past the dead connections (``_retried``)."""
        live = self.live()
        if not live or not all(n.booted() for n in live):
            return False
        assert self.cluster is not None
        self.note("db_restart", version=self.cluster.version, live=len(live))
        outage = chaos_db.restart(self.cluster)
        self.db_restarts.append(outage)
        down = outage.down_to - outage.down_from if outage.down_to and outage.down_from else 0
        self.note("db_ready", took=round(outage.ready - outage.began, 2), down=round(down, 2))
        return True

    def follow_up(self, store: Any) -> None:
        """Drains that ended (checked, then replaced), restarts that are due, stalls over."""
        stall = self.staller.poll() if self.staller else None
        if stall is not None:
            self.stalls.append(stall)
            self.note("stall_end", took=round(stall.ready - stall.began, 2))
        for node in list(self.draining):
            if not node.reaped():
                continue
            self.draining.remove(node)
            assert node.run is not None
            node.run.left = tuple(self.leased_by(store, node.name))
            took = (node.run.exited or 0) - (node.run.signalled or 0)
            self.note(
                "exited",
                node=node.name,
                code=node.run.exit_code,
                took=round(took, 2),
                left=len(node.run.left),
            )
            if node.run.how == "drain":
                slot = next(k for k, v in self.slots.items() if v is node)
                self.restarts.append((self.elapsed(), slot))  # at once, but not in a stall
        stalled = self.staller is not None and self.staller.active
        for at, slot in list(self.restarts):
            # a supervisor booting through a stall gives up connecting (exit 2 after the
            # 5 s connect timeout): the restart waits for the stall's end
            if self.elapsed() >= at and not stalled:
                self.restarts.remove((at, slot))
                self.start_node(slot)
        for node in self.nodes:  # a supervisor that died without being told to: a violation,
            # but its slot is refilled so the rest of the run still means something
            if node.run and node.run.how is None and node.run.exited is None and node.reaped():
                self.note("died", node=node.name, code=node.run.exit_code)
                slot = next((k for k, v in self.slots.items() if v is node), None)
                if slot is not None:
                    self.restarts.append((self.elapsed() + 1.0, slot))

    # -- the whole run --

    def run(self) -> Report:
        from supervisor.client import Client
        from supervisor.config import load_config
        from supervisor.store import open_store

        config = load_config(self.config)
        store = open_store(self.url)
        try:
            if _all_jobs(store, None, limit=1):
                raise SystemExit(f"chaos: {self.url} already holds jobs; give it an empty one")
            client = Client(config, store)
            items = plan_jobs(self.s, self.rng, self.exec_log, self.lock_dir)
            self.schedule()
            self.t0 = time.monotonic()
            for slot in range(1, self.s.supervisors + 1):
                self.start_node(slot)
            self.sampler.start()
            try:
                self.loop(store, client, items, config)
            finally:
                if self.staller is not None and self.staller.active:
                    self.stalls.append(self.staller.finish())  # the final drain needs it
                if self.cluster is not None and not chaos_db.ensure_running(self.cluster):
                    self.note("db_down", version=self.cluster.version)
                self.stop_all()
            return self.collect(store, config)
        finally:
            store.close()

    def loop(self, store: Any, client: Any, items: list[Item], config: Any) -> None:
        feed_until = 0.8 * self.s.duration
        fed = 0
        final = 0
        last_stats = 0.0
        last_line = 0.0
        deadline = self.s.duration + self.s.tail
        with self.progress() as progress:
            task = progress.add_task("jobs", total=len(items))
            while True:
                now = self.elapsed()
                due = len(items) if now >= feed_until else int(len(items) * now / feed_until)
                if due > fed:
                    batch = items[fed:due]
                    jobs = [{"kind": i.kind, "payload": i.payload} for i in batch]
                    ids = _retried(client.enqueue_many, jobs)
                    for job_id, item in zip(ids, batch, strict=True):
                        self.plan[job_id] = PlannedJob(item.kind, item.pool, item.expect)
                    fed = due
                for ev in [e for e in self.pending if e.at <= now]:
                    if self.fault(ev, store):
                        self.pending.remove(ev)
                self.follow_up(store)
                self.most_running = max(self.most_running, sum(n.running() for n in self.nodes))
                if now - last_stats >= 1.0:
                    last_stats = now
                    # counted here, not with store.stats(): its counts stop at a cap
                    queued, leased = (len(_all_jobs(store, st)) for st in OPEN)
                    final = fed - queued - leased
                    line = self.status(fed, final, queued, leased)
                    progress.update(task, completed=final, description=line)
                    if not self.console.is_terminal and now - last_line >= 15.0:
                        last_line = now
                        self.console.log(line)
                busy = self.restarts or self.draining
                later = [e for e in self.pending if e.at > now]
                if fed == len(items) and not busy and final >= len(items) and not later:
                    for ev in self.pending:  # no job left to hit: recorded, not waited for
                        self.skipped[ev.what] += 1
                        self.note("skipped", fault=ev.what)
                    return
                if now > deadline:
                    self.timed_out = True
                    self.note("timeout", final=final, enqueued=len(items))
                    return
                time.sleep(0.05)

    def status(self, fed: int, final: int, queued: int, leased: int) -> str:
        runs = [n.run for n in self.nodes if n.run]
        return (
            f"fed {fed} final {final} queued {queued} leased {leased} | "
            f"worker kills {len(self.kills)} sup kills {sum(r.how == 'kill' for r in runs)} "
            f"drains {sum(r.how == 'drain' for r in runs)} "
            f"leaves {sum(r.how == 'leave' for r in runs)} "
            + (f"db restarts {len(self.db_restarts)} " if self.cluster else "")
            + f"| live {len(self.live())}"
        )

    @contextlib.contextmanager
    def progress(self) -> Iterator[Progress]:
        progress = Progress(
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            console=self.console,
            disable=not self.console.is_terminal,
        )
        with progress:
            yield progress

    def stop_all(self) -> None:
        """SIGTERM every live supervisor (a normal stop), SIGKILL any that hangs; then wait for
        every process any of them ever had, and kill what is left (recorded)."""
        booting = time.monotonic() + BOOT_WAIT
        while time.monotonic() < booting and any(
            n.running() and not n.booted() for n in self.nodes
        ):
            time.sleep(0.1)  # a replacement started in the last seconds: SIGTERM after boot
        for node in self.nodes:
            if node.running() and node.run and node.run.how is None:
                node.signal(signal.SIGTERM, "stop")
        deadline = time.monotonic() + GRACE + 15.0
        for node in self.nodes:
            if node.proc is None:
                continue
            try:
                node.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.note("stop_timeout", node=node.name)
                node.proc.kill()
                node.proc.wait(5)
            node.reaped()
        self.sampler.stop.set()
        self.sampler.join()
        hold = max(float(p[1].get("hold", 0)) for p in POISON if p[0] == "fork_bomb")
        end = time.monotonic() + hold + 3.0
        while time.monotonic() < end and self.leftovers(kill=False):
            time.sleep(0.2)
        self.left = self.leftovers(kill=True)

    def leftovers(self, *, kill: bool) -> list[str]:
        out = []
        procs = [(n.name, p) for n in self.nodes for p in n.alive_seen()]
        procs += [("a SIGKILLed supervisor (orphan)", p) for p in self.orphans.values() if alive(p)]
        for owner, p in procs:
            try:
                desc = f"pid {p.pid} {' '.join(p.cmdline())[:60]!r} of {owner}"
            except psutil.Error:
                continue
            out.append(desc)
            if kill:
                with contextlib.suppress(psutil.Error):
                    p.kill()
        return out

    # -- the evidence --

    def collect(self, store: Any, config: Any) -> Report:
        jobs = {j.id: j for j in _all_jobs(store, None)}
        executions, torn = read_executions(self.exec_log)
        logs = [read_log(node.name, node.log_path) for node in self.nodes]
        ev = Evidence(
            plan=self.plan,
            jobs=jobs,
            executions=executions,
            nodes=[n.run for n in self.nodes if n.run],
            kills=self.kills,
            failures=[f for log in logs for f in log.failures],
            max_deliveries={p.name: p.max_deliveries for p in config.pools.values()},
            caps={"call": DOWNSTREAM_SLOTS},
            torn_lines=torn,
            lost_leases=[e for log in logs for e in log.lost],
            expired_leases=[e for log in logs for e in log.expired],
            log_problems=[p for log in logs for p in log.problems],
            leftovers=self.left,
            orphans_after_kill=len(self.orphans),
            orphans_after_restart=len(self.orphans_late),
            bomb_procs_max=self.sampler.bomb_max if self.bomb_uid is not None else None,
            nproc_limit=NPROC_LIMIT if self.bomb_uid is not None else None,
            bomb_workers_max=POOLS["poison"][1]["max_workers"] * self.most_running,
            timed_out=self.timed_out,
            db_restarts=self.db_restarts,
            stalls=self.stalls,
            timeouts={p.name: p.timeout + (p.soft_timeout or 0.0) for p in config.pools.values()},
        )
        with open(self.folder / "nodes.json", "w") as f:
            json.dump([asdict(n) for n in ev.nodes], f, indent=1)
        return check(ev)


OPEN = (JobState.QUEUED, JobState.LEASED)


def _all_jobs(store: Any, state: Any, limit: int | None = None) -> list[Any]:
    out: list[Any] = []
    after = 0
    while True:
        page = _retried(store.list_jobs, state=state, limit=1000, after_id=after)
        out += page
        if len(page) < 1000 or (limit is not None and len(out) >= limit):
            return out
        after = page[-1].id


def _retried(call: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``call(*args, **kwargs)``, repeated while the store is unavailable, for up to
    ``RETRY_FOR`` seconds: after a server restart the connections pooled before it fail one
    by one.

    Safe for the harness's reads, and for its enqueues: the harness restarts the server only
    between two of its own calls, so an enqueue fails on a dead connection before anything
    was sent, never between its commit and the reply. (Were a commit ever lost that way, the
    retry would add rows the run did not plan: the "unexpected rows" check.)"""
    from supervisor.errors import StoreUnavailable

    deadline = time.monotonic() + RETRY_FOR
    while True:
        try:
            return call(*args, **kwargs)
        except StoreUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def read_executions(path: Path) -> tuple[list[dict[str, Any]], int]:
    runs, torn = [], 0
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            try:
                runs.append(json.loads(line))
            except json.JSONDecodeError:
                torn += 1
    return runs, torn


_LOST = re.compile(r"^job (\d+): its lease")


@dataclass(slots=True)
class NodeLog:
    """What one supervisor's JSON log says: its failed deliveries, the leases it lost while
    running their jobs, the expired leases its reaper found, and its problems (tracebacks,
    lines that are not JSON)."""

    failures: list[LoggedFailure] = field(default_factory=list)
    lost: list[LeaseEvent] = field(default_factory=list)
    expired: list[LeaseEvent] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def read_log(node: str, path: Path) -> NodeLog:
    """A supervisor's JSON log (see ``NodeLog``)."""
    out = NodeLog()
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return out
    stray = 0
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            stray += 1
            if "Traceback" in line:
                out.problems.append(f"{node}: a traceback in its log ({path.name})")
            continue
        if isinstance(rec, dict):
            _read_record(out, node, rec, path.name)
    if stray:
        out.problems.append(f"{node}: {stray} line(s) of its log are not JSON ({path.name})")
    return out


def _read_record(out: NodeLog, node: str, rec: dict[str, Any], name: str) -> None:
    if rec.get("exc"):
        out.problems.append(f"{node}: {rec.get('msg', '')[:200]} (traceback in {name})")
    ts = datetime.fromisoformat(str(rec.get("ts", "1970-01-01T00:00:00Z"))).timestamp()
    event = rec.get("event")
    if event == "job_failed":
        out.failures.append(
            LoggedFailure(
                ts,
                node,
                int(rec["job_id"]),
                int(rec.get("attempt") or 0),
                str(rec.get("error_kind")),
                str(rec.get("msg", "")),
                rec.get("duration"),
            )
        )
    elif event in ("job_lease_expired", "job_dead") and rec.get("error_kind") == "lease_expired":
        out.expired.append(LeaseEvent(ts, node, int(rec["job_id"])))
    m = _LOST.match(str(rec.get("msg", "")))
    if m:
        out.lost.append(LeaseEvent(ts, node, int(m[1])))


# ---- databases --------------------------------------------------------------------------


@contextlib.contextmanager
def database(spec: str, folder: Path, postgres_url: str, seed: int) -> Iterator[str]:
    if spec == "sqlite":
        yield f"sqlite:///{folder / 'chaos.db'}"
        return
    if spec != "postgres":
        yield spec
        return
    import psycopg

    schema = f"chaos_{os.getpid()}_{seed}"
    plain = postgres_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(plain, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        conn.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in postgres_url else "?"
    try:
        yield f"{postgres_url}{sep}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(plain, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


# ---- output -----------------------------------------------------------------------------


def render(report: Report, console: Console, title: str) -> None:
    table = Table(title=title, show_lines=False)
    table.add_column("section")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for section, names in report.figures.items():
        first = True
        for name, value in names.items():
            table.add_row(section if first else "", name, str(value))
            first = False
        table.add_section()
    console.print(table)
    if report.violations:
        console.print(f"[bold red]{len(report.violations)} violation(s):[/]")
        for v in report.violations[:200]:
            console.print(f"  - {v}", markup=False, highlight=False)
    else:
        console.print("[bold green]every invariant held[/]")


def restartable(args: argparse.Namespace, etc: Path = chaos_db.ETC) -> chaos_db.Cluster | None:
    """The PostgreSQL cluster ``--allow-db-restart`` restarts (None without the flag);
    ``NotRestartable`` when this run's database is not one the harness can restart."""
    if not args.allow_db_restart:
        return None
    url = {"sqlite": "sqlite://", "postgres": args.postgres_url}.get(args.database, args.database)
    return chaos_db.cluster_for(url, etc)


def _reachable(folder: Path) -> bool:
    """Every parent of ``folder`` lets other users through (o+x)."""
    return all(p.stat().st_mode & 0o001 for p in folder.resolve().parents)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run(args: argparse.Namespace) -> int:
    # SIGTERM and SIGINT (ignored by a shell's background jobs) stop the run through its
    # finally blocks: every supervisor stopped, nothing left running
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    console = Console(log_path=False)
    s = Settings.from_args(args)
    if s.jobs < 20 or s.duration < 10:
        console.print("chaos: --jobs must be at least 20 and --duration at least 10 s")
        return 2
    try:
        cluster = restartable(args)
    except chaos_db.NotRestartable as exc:
        print(f"chaos: --allow-db-restart: {exc}", file=sys.stderr)
        return 2
    if args.db_restarts is not None and (cluster is None or args.db_restarts < 0):
        print("chaos: --db-restarts takes a count >= 0, with --allow-db-restart", file=sys.stderr)
        return 2
    own_folder = args.folder is None
    folder = Path(tempfile.mkdtemp(prefix="fleetd-chaos-")) if own_folder else args.folder
    folder.mkdir(parents=True, exist_ok=True)
    if any(folder.iterdir()):
        console.print(f"chaos: {folder} is not empty")
        return 2
    if s.bomb_user and not _reachable(folder):
        console.print(
            f"chaos: {folder} must be reachable by other users (the poison pool runs as "
            f"{s.bomb_user!r}); choose a --folder whose parents are all o+x"
        )
        return 2
    started = time.time()
    with database(s.database, folder, args.postgres_url, s.seed) as url:
        console.print(
            f"chaos: seed {s.seed}, {s.jobs} jobs over {s.duration:.0f}s, {s.supervisors} "
            f"supervisor(s), database {s.database}, folder {folder}"
        )
        if not s.bomb_user:
            console.print("chaos: not root: no fork bomb (a pool's user needs root)")
        staller = Staller(url) if s.stalls else None
        chaos = Chaos(s, folder, url, console, cluster, staller)
        try:
            report = chaos.run()
        except KeyboardInterrupt:
            console.print(f"chaos: interrupted; every supervisor stopped; folder {folder}")
            return 130
        except chaos_db.RestartFailed as exc:
            console.print(f"chaos: database restart failed: {exc}; run stopped; folder {folder}")
            return 1
        finally:
            if staller is not None:
                staller.close()
    wall = time.time() - started
    report.figures = {
        "run": {
            "seed": s.seed,
            "database": s.database if s.database in ("sqlite", "postgres") else "url",
            "supervisors": s.supervisors,
            "duration (fault window)": f"{s.duration:.0f}s",
            "wall time": f"{wall:.1f}s",
            "timed out": chaos.timed_out,
            "faults not injected (no busy worker left)": sum(chaos.skipped.values()),
        },
        **report.figures,
    }
    render(report, console, f"fleetd chaos (seed {s.seed})")
    if args.json:
        args.json.write_text(
            json.dumps(
                {"settings": asdict(s), "figures": report.flat(), "violations": report.violations},
                indent=1,
                default=str,
            )
        )
    keep = args.keep or bool(report.violations) or not own_folder
    if keep:
        console.print(f"run folder kept: {folder}")
    else:
        shutil.rmtree(folder, ignore_errors=True)
    return 1 if report.violations else 0
