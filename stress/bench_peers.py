"""Side by side: the same workloads through fleetd and, where installed, Celery, RQ, Dramatiq
and procrastinate, in one run on one machine (``pip install -e '.[bench]'`` for the peers).

Every peer runs ``WORKERS`` = 2 worker processes, started as a user would start them (a real
subprocess of its own command line: ``fleetd start``, ``celery worker -P prefork``, ``rq
worker-pool``, ``dramatiq``, ``procrastinate worker``), each measurement in a fresh namespace
(queue, key prefix, schema or database). Every job body is the same function
(``stress.peers.tasks``), and the figures come from what the bodies append to a marker file,
the same way for every peer:

- no-op throughput: ``--jobs`` no-op jobs enqueued first, then the workers started; jobs per
  second from the first completion to the last (each peer's boot excluded); median of
  ``--repeat`` runs, the peers interleaved within each round so load drift hits them alike;
- CPU-bound throughput: ``--cpu-jobs`` jobs of a fixed loop calibrated to ~20 ms, the same way;
- idle pickup: on an idle fleet, one job at a time (``--samples``), 50–250 ms apart; pickup is
  the job's own ``time.time()`` at its start minus the time just before the enqueue call;
- faults (``--skip-faults`` to skip): a gradual memory bomb, a hang, a crash, and a SIGTERM
  drain with a 30 s job in flight, each observed for at most ``--fault-cap`` seconds, with a
  stream of no-op jobs alongside to see whether the rest kept running.

The bomb never holds more than 3 GiB (``tasks.HOST_CAP_MIB``), the harness SIGKILLs a peer
whose processes pass 3.5 GiB together, and every process a peer started is SIGKILLed at the
end of each measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import psutil
from rich.console import Console
from rich.table import Table

from stress.peers import PEERS, ROOT, WORKERS, Namespace, Peer, PeerSpec

HELP = "fleetd against Celery, RQ, Dramatiq and procrastinate: throughput, pickup, faults"
GUARD_BYTES = int(3.5 * 1024**3)  # a peer's processes together past this are SIGKILLed
CPU_MS = 20  # the CPU-bound job's target duration
console = Console(width=None if sys.stdout.isatty() else 160)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--peers",
        type=_peer_list,
        default=list(PEERS),
        help=f"comma-separated, from {','.join(PEERS)} (default: all)",
    )
    parser.add_argument("--jobs", type=int, default=5000, help="no-op jobs per throughput run")
    parser.add_argument("--cpu-jobs", type=int, default=400, help="CPU-bound jobs per run")
    parser.add_argument("--samples", type=int, default=200, help="idle pickups per peer")
    parser.add_argument("--repeat", type=int, default=3, help="throughput runs (median)")
    parser.add_argument(
        "--skip-faults", action="store_true", help="same as --parts noop,cpu,pickup"
    )
    parser.add_argument(
        "--parts",
        type=_part_list,
        default=list(PARTS),
        help=f"comma-separated, from {','.join(PARTS)} (default: all)",
    )
    parser.add_argument("--fault-cap", type=float, default=20.0, help="seconds per fault")
    parser.add_argument("--json", type=Path, help="write every figure to this file")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("FLEETD_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1/test"),
    )
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs)")


PARTS = ("noop", "cpu", "pickup", "faults")


def _part_list(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names or any(n not in PARTS for n in names):
        raise argparse.ArgumentTypeError(f"parts are {', '.join(PARTS)}")
    return names


def _peer_list(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in PEERS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown peer {', '.join(unknown) or '(none)'}; choose from {', '.join(PEERS)}"
        )
    return names


# ---- processes and marks ---------------------------------------------------------------------


class Mark(NamedTuple):
    """One line a job body wrote: ``event tag pid time``."""

    event: str
    tag: str
    pid: int
    t: float


class Marks:
    """The marker file, read incrementally."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.offset = 0
        self.all: list[Mark] = []

    def poll(self) -> list[Mark]:
        """Read the complete lines appended since the last call; return them."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        new = []
        for line in data[:end].decode().splitlines():
            event, tag, pid, t = line.split(" ")
            new.append(Mark(event, tag, int(pid), float(t)))
        self.all += new
        return new

    def of(self, event: str, tag: str | None = None) -> list[Mark]:
        return [m for m in self.all if m.event == event and (tag is None or m.tag == tag)]

    def has(self, event: str, tag: str | None = None) -> bool:
        """Whether such a mark has been written (reading the file first)."""
        self.poll()
        return bool(self.of(event, tag))

    def count(self) -> int:
        self.poll()
        return len(self.all)

    def tagged(self, tag: str) -> list[Mark]:
        """Every mark of one job (``tag``, or ``tag:...`` for the bomb's memory steps)."""
        return [m for m in self.all if m.tag == tag or m.tag.startswith(tag + ":")]


class Workers:
    """A peer's worker processes: each command its own session, every descendant tracked so
    that the end of a measurement can SIGKILL all of them (RQ's work horses and fleetd's
    workers leave the process group)."""

    def __init__(self, peer: Peer, log: Path) -> None:
        self.started = time.time()
        self.mains: list[subprocess.Popen[bytes]] = []
        self.seen: dict[int, psutil.Process] = {}
        with open(log, "ab") as out:
            for cmd in peer.commands():
                self.mains.append(
                    subprocess.Popen(
                        cmd,
                        cwd=ROOT,
                        env=peer.env(),
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )

    def tree(self) -> list[psutil.Process]:
        """The live processes: the mains and their descendants (remembered for ``kill``)."""
        procs = []
        for main in self.mains:
            with suppress(psutil.Error):
                p = psutil.Process(main.pid)
                procs += [p, *p.children(recursive=True)]
        for p in procs:
            self.seen.setdefault(p.pid, p)
        return procs

    def rss(self) -> int:
        total = 0
        for p in self.tree():
            with suppress(psutil.Error):
                total += p.memory_info().rss
        return total

    def alive(self) -> bool:
        return any(m.poll() is None for m in self.mains)

    def exits(self) -> str:
        """The worker commands that have exited, with their codes ("" when none has): a
        queue whose whole worker exits on a job's crash needs something to restart it."""
        codes = [m.poll() for m in self.mains]
        gone = [c for c in codes if c is not None]
        if not gone:
            return ""
        which = (
            "the worker command"
            if len(codes) == 1
            else f"{len(gone)} of {len(codes)} worker commands"
        )
        return f"{which} exited (code {', '.join(map(str, gone))})"

    def terminate(self) -> None:
        """SIGTERM to each main process, as a deploy (systemd's main PID, Kubernetes' PID 1)."""
        for m in self.mains:
            if m.poll() is None:
                m.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL every process this peer started, wherever it went."""
        self.tree()
        for p in self.seen.values():
            with suppress(psutil.Error):
                if p.is_running():
                    p.kill()
        for m in self.mains:
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(m.pid, signal.SIGKILL)
            with suppress(subprocess.TimeoutExpired):
                m.wait(timeout=10)


@contextmanager
def running(peer: Peer, log: Path) -> Iterator[Workers]:
    workers = Workers(peer, log)
    try:
        yield workers
    finally:
        workers.kill()


class Run:
    """Shared state of one ``bench`` run: options, the work folder, namespace names."""

    def __init__(self, args: argparse.Namespace, folder: Path) -> None:
        self.args = args
        self.folder = folder
        self.count = 0

    @contextmanager
    def peer(self, spec: PeerSpec, **options: Any) -> Iterator[Peer]:
        """A peer bound to a fresh namespace, set up, torn down afterwards."""
        self.count += 1
        name = f"fb{os.getpid()}_{self.count}"
        folder = self.folder / f"{spec.name}-{self.count}"
        folder.mkdir()
        ns = Namespace(name, folder, self.args.redis_url, self.args.postgres_url)
        peer = spec.load()(ns, **options)
        peer.setup()
        try:
            yield peer
        finally:
            peer.teardown()


def wait_for(check: Callable[[], bool], timeout: float, step: float = 0.005) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if check():
            return True
        time.sleep(step)
    return check()


def ready(peer: Peer, marks: Marks, timeout: float = 60.0) -> bool:
    """Wait until the workers run a job: the fleet is up (boot excluded from what follows)."""
    peer.enqueue("pickup", marker=peer.ns.marker, tag="ready")
    return wait_for(lambda: marks.has("start", "ready"), timeout)


# ---- throughput and pickup -------------------------------------------------------------------


def throughput(run: Run, spec: PeerSpec, task: str, n: int, extra: dict[str, Any]) -> float:
    """Jobs per second: ``n`` jobs enqueued before the workers start, first to last done."""
    cap = max(180.0, n / 20)
    with run.peer(spec) as peer:
        marks = Marks(peer.ns.marker)
        peer.enqueue_many(task, [{"marker": peer.ns.marker, **extra} for _ in range(n)])
        with running(peer, peer.ns.folder / "workers.log"):
            wait_for(lambda: marks.count() >= n, cap, 0.05)
    done = sorted(m.t for m in marks.of("done"))
    if len(done) < n:
        console.print(f"  [yellow]{spec.name}: {len(done)} of {n} done in {cap:.0f} s[/]")
    return (len(done) - 1) / (done[-1] - done[0]) if len(done) > 1 else 0.0


def pickups(run: Run, spec: PeerSpec, samples: int) -> list[float]:
    """Seconds from just before each enqueue call to the job's own start, on an idle fleet."""
    rng = random.Random(7)
    out: list[float] = []
    with run.peer(spec) as peer, running(peer, peer.ns.folder / "workers.log"):
        marks = Marks(peer.ns.marker)
        if not ready(peer, marks):
            raise RuntimeError("workers did not run a job within 60 s")
        time.sleep(1.0)
        for i in range(samples):
            tag = str(i)
            t0 = time.time()
            peer.enqueue("pickup", marker=peer.ns.marker, tag=tag)
            if wait_for(lambda tag=tag: marks.has("start", tag), 10):
                out.append(marks.of("start", tag)[0].t - t0)
            time.sleep(rng.uniform(0.05, 0.25))
    return out


def calibrate(ms: float = CPU_MS) -> int:
    """Loops of ``tasks.burn``'s body that take ``ms`` here (the fastest of 5 tries)."""
    from stress.peers.tasks import burn

    n = 200_000
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        burn(os.devnull, n)
        best = min(best, time.perf_counter() - t0)
    return int(n * ms / 1000 / best)


# ---- faults ----------------------------------------------------------------------------------


@dataclass
class Watch:
    """One fault's observation: marks, the peer's processes, a stream of no-op jobs."""

    peer: Peer
    workers: Workers
    marks: Marks
    canaries: list[tuple[str, float]] = field(default_factory=list)
    peak_rss: int = 0
    guard_tripped: bool = False
    next_canary: float = 0.0

    def tick(self) -> None:
        """One 50 ms step: read marks, sample memory (guard the host), feed a canary."""
        self.marks.poll()
        rss = self.workers.rss()
        self.peak_rss = max(self.peak_rss, rss)
        if rss > GUARD_BYTES:
            self.guard_tripped = True
            self.workers.kill()
        now = time.time()
        if now >= self.next_canary and self.workers.alive():
            tag = f"c{len(self.canaries)}"
            self.peer.enqueue("noop", marker=self.peer.ns.marker, tag=tag)
            self.canaries.append((tag, now))
            self.next_canary = now + 0.5
        time.sleep(0.05)

    def others(self, settle: float = 3.0) -> str:
        """How many canaries ran (waiting ``settle`` s for the last ones)."""
        tags = {t for t, _ in self.canaries}
        wait_for(lambda: tags <= _done_tags(self.marks), settle, 0.05)
        done = len(tags & _done_tags(self.marks))
        return f"{done}/{len(tags)} no-op jobs ran alongside"


def _done_tags(marks: Marks) -> set[str]:
    marks.poll()
    return {m.tag for m in marks.of("done")}


def executions(marks: Marks, tag: str) -> list[list[Mark]]:
    """One job's marks split into executions, at each ``start``."""
    out: list[list[Mark]] = []
    for m in sorted(marks.tagged(tag), key=lambda m: m.t):
        if m.event == "start" or not out:
            out.append([])
        out[-1].append(m)
    return out


def observe(watch: Watch, job: str, tag: str, cap: float) -> None:
    """Watch until the queue is done with the job and its marks have been quiet for 2 s, or
    ``cap`` seconds."""
    deadline = time.time() + cap
    while time.time() < deadline and not watch.guard_tripped:
        watch.tick()
        quiet = time.time() - max((m.t for m in watch.marks.tagged(tag)), default=0) > 2
        if quiet and watch.marks.tagged(tag) and watch.peer.fate(job).final:
            break


@contextmanager
def fault_fleet(run: Run, spec: PeerSpec, **options: Any) -> Iterator[Watch]:
    with run.peer(spec, **options) as peer, running(peer, peer.ns.folder / "workers.log") as w:
        marks = Marks(peer.ns.marker)
        if not ready(peer, marks):
            raise RuntimeError("workers did not run a job within 60 s")
        yield Watch(peer, w, marks)


def memory_bomb(run: Run, spec: PeerSpec) -> dict[str, str]:
    """50 MiB every 50 ms toward 4 GiB (held to 3 GiB by the fixture). Time limits at 60 s,
    so what stops it is the memory feature, not a time limit."""
    with fault_fleet(run, spec, time_limit=60.0) as watch:
        job = watch.peer.enqueue("bomb", marker=watch.peer.ns.marker, tag="bomb")
        observe(watch, job, "bomb", run.args.fault_cap)
        runs = executions(watch.marks, "bomb")
        fate = watch.peer.fate(job).text
        others = _join(watch.others(), watch.workers.exits())
        afterwards = _process_after(runs[-1][0].pid) if runs else ""
    stopped = _bomb_stopped(runs[0]) if runs else "never started"
    if watch.guard_tripped:
        stopped += "; harness SIGKILLed the peer at 3.5 GiB"
    return {
        "stopped": stopped,
        "fate": f"{fate}; ran {len(runs)}x; {afterwards}",
        "others": others + f"; peak RSS of the peer's processes {watch.peak_rss / 2**20:,.0f} MiB",
    }


def _process_after(pid: int) -> str:
    """What became of the process that ran the bomb last: gone, or alive with its RSS."""
    try:
        rss = psutil.Process(pid).memory_info().rss
    except psutil.Error:
        return "its process is gone"
    return f"its process lives on, RSS {rss / 2**20:,.0f} MiB"


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def _bomb_stopped(execution: list[Mark]) -> str:
    start = execution[0].t
    held = max((int(m.tag.split(":")[1]) for m in execution if m.event == "mem"), default=0)
    last = execution[-1].t - start
    if any(m.event == "cap" for m in execution):
        return f"no: reached the fixture's 3 GiB cap in {last:.1f} s and returned"
    return f"yes, at {held:,} MiB, {last:.1f} s in"


def hang(run: Run, spec: PeerSpec) -> dict[str, str]:
    """A job that sleeps for 60 s; each peer's time limit at 5 s where it has one."""
    with fault_fleet(run, spec) as watch:
        job = watch.peer.enqueue("hang", marker=watch.peer.ns.marker, tag="hang")
        observe(watch, job, "hang", run.args.fault_cap)
        runs = executions(watch.marks, "hang")
        fate = watch.peer.fate(job).text
        others = _join(watch.others(), watch.workers.exits())
        stopped = _beating_stopped(runs[0], time.time()) if runs else "never started"
    return {
        "stopped": stopped,
        "fate": f"{fate}; ran {len(runs)}x in {run.args.fault_cap:.0f} s",
        "others": others,
    }


def _beating_stopped(execution: list[Mark], now: float) -> str:
    """How a ``tasks.beating`` execution ended, from its marks."""
    start, last = execution[0].t, execution[-1]
    exits = [m.tag.split(":", 1)[1] for m in execution if m.event == "exit"]
    if any(m.event == "end" for m in execution):
        return f"no: ran to its end ({last.t - start:.1f} s)"
    if now - last.t < 1.0:
        return f"no: still running at {last.t - start:.1f} s"
    how = f"{exits[0]} raised in it" if exits else "its process killed"
    return f"yes, {last.t - start:.1f} s in ({how})"


def crash(run: Run, spec: PeerSpec) -> dict[str, str]:
    """``os._exit(3)`` in the middle of a job."""
    with fault_fleet(run, spec) as watch:
        job = watch.peer.enqueue("crash", marker=watch.peer.ns.marker, tag="crash")
        observe(watch, job, "crash", run.args.fault_cap)
        runs = executions(watch.marks, "crash")
        fate = watch.peer.fate(job).text
        others = watch.others()
        exits = watch.workers.exits()
    return {
        "stopped": "(the job ended its own process)",
        "fate": f"{fate}; ran {len(runs)}x in {run.args.fault_cap:.0f} s",
        "others": _join(others, exits),
    }


def drain(run: Run, spec: PeerSpec) -> dict[str, str]:
    """SIGTERM to the worker command with a 30 s job in flight and 1 s jobs queued; then a
    restart in the same namespace, to see the long job's fate."""
    cap = run.args.fault_cap
    with run.peer(spec, time_limit=60.0) as peer:
        marks = Marks(peer.ns.marker)
        with running(peer, peer.ns.folder / "workers.log") as w:
            if not ready(peer, marks):
                raise RuntimeError("workers did not run a job within 60 s")
            long_id = peer.enqueue("long", marker=peer.ns.marker, tag="long", seconds=30.0)
            _wait_mark(marks, "start", "long", 10)
            shorts = [f"s{i}" for i in range(6)]
            short_ids = [
                peer.enqueue("short", marker=peer.ns.marker, tag=tag, seconds=1.0) for tag in shorts
            ]
            # any of them: a peer that prefetches may hold s0 behind the long job
            if not wait_for(lambda: any(marks.has("start", t) for t in shorts), 10):
                raise RuntimeError("no 1 s job started within 10 s")
            time.sleep(0.3)
            t_sig = time.time()
            w.terminate()
            exited = wait_for(lambda: not w.alive(), cap, 0.05)
            exit_s = time.time() - t_sig
        marks.poll()
        stopped = _drain_stopped(executions(marks, "long")[0], t_sig, exited, cap)
        during = _shorts_during(marks, shorts, t_sig)
        before_restart = peer.fate(long_id).text
        with running(peer, peer.ns.folder / "restart.log"):
            time.sleep(10.0)
            marks.poll()
            after = peer.fate(long_id).text
        again = len(executions(marks, "long")) > 1
        done = sum(1 for t in shorts if marks.of("end", t))
        missing = [
            (t, peer.fate(i).text)
            for t, i in zip(shorts, short_ids, strict=True)
            if not marks.of("end", t)
        ]
    stuck = f" (not done: {', '.join(f'{t} {f}' for t, f in missing)})" if missing else ""
    return {
        "stopped": stopped,
        "exit": f"{exit_s:.1f} s" if exited else f"not within {cap:.0f} s: SIGKILLed",
        "fate": (
            f"after exit: {before_restart}; after a restart: "
            + ("ran again" if again else f"not run again ({after})")
        ),
        "others": f"{during}; {done}/{len(shorts)} 1 s jobs done after the restart{stuck}",
    }


def _wait_mark(marks: Marks, event: str, tag: str, timeout: float) -> None:
    if not wait_for(lambda: marks.has(event, tag), timeout):
        raise RuntimeError(f"no '{event} {tag}' mark within {timeout:.0f} s")


def _drain_stopped(execution: list[Mark], t_sig: float, exited: bool, cap: float) -> str:
    """Whether the drain stopped the long job, from its marks: it ran to its end, ran on until
    the harness's SIGKILL at the cap, or stopped earlier (by an exception or a kill)."""
    last = execution[-1]
    after = last.t - t_sig
    if any(m.event == "end" for m in execution):
        return f"no: finished {after:.1f} s after SIGTERM"
    if not exited and cap - after < 1.0:
        return "no: ran on until the harness's SIGKILL"
    exits = [m.tag.split(":", 1)[1] for m in execution if m.event == "exit"]
    how = f"{exits[0]} raised" if exits else "killed"
    return f"yes, {after:.1f} s after SIGTERM ({how})"


def _shorts_during(marks: Marks, shorts: list[str], t_sig: float) -> str:
    """What the 1 s jobs did while the workers drained: the one in flight, and new starts."""
    in_flight = [t for t in shorts if any(m.t < t_sig for m in marks.of("start", t))]
    in_flight = [t for t in in_flight if not any(m.t < t_sig for m in marks.of("end", t))]
    finished = [t for t in in_flight if marks.of("end", t)]
    started = [t for t in shorts if any(m.t >= t_sig for m in marks.of("start", t))]
    started = [t for t in started if t not in in_flight]
    return (
        f"1 s job in flight finished: {len(finished)}/{len(in_flight)}; "
        f"new ones started during the drain: {len(started)}"
    )


FAULTS: dict[str, Callable[[Run, PeerSpec], dict[str, str]]] = {
    "memory bomb": memory_bomb,
    "hang": hang,
    "crash (os._exit(3))": crash,
    "SIGTERM drain, 30 s job in flight": drain,
}


# ---- the run ---------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    versions = {name: PEERS[name].version() for name in args.peers}
    present = [PEERS[n] for n in args.peers if versions[n]]
    results: dict[str, Any] = {"machine": machine(), "args": _jsonable(vars(args))}
    results["versions"] = versions
    console.print(f"[bold]bench[/] on {results['machine']['summary']}")
    with tempfile.TemporaryDirectory(prefix="fleetd-bench-") as tmp:
        folder = Path(tmp)
        bench = Run(args, folder)
        parts = [p for p in args.parts if not (args.skip_faults and p == "faults")]
        results["loops"] = loops = calibrate()
        results["throughput"] = rates(bench, present, "noop", args.jobs, {}, "noop" in parts)
        results["cpu"] = rates(
            bench, present, "burn", args.cpu_jobs, {"loops": loops}, "cpu" in parts
        )
        results["pickup"] = {
            s.name: _guarded(pickups, bench, s, args.samples) for s in present if "pickup" in parts
        }
        results["faults"] = faults(bench, present) if "faults" in parts else {}
        if args.keep:
            keep = Path(tempfile.mkdtemp(prefix="fleetd-bench-kept-"))
            subprocess.run(["cp", "-a", f"{tmp}/.", str(keep)], check=False)
            console.print(f"work folder kept in {keep}")
    results["machine"]["load_after"] = os.getloadavg()
    if set(parts) - {"faults"}:
        console.print(summary_table(args.peers, versions, results))
    if results["faults"]:
        console.print(fault_table(results["faults"]))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
        console.print(f"figures written to {args.json}")
    return 0


def rates(
    bench: Run, present: list[PeerSpec], task: str, n: int, extra: dict[str, Any], wanted: bool
) -> dict[str, list[float] | str]:
    """``--repeat`` rounds; within a round every peer once, so load drift hits them alike."""
    if not wanted:
        return {}
    out: dict[str, list[float] | str] = {s.name: [] for s in present}
    for r in range(bench.args.repeat):
        for spec in present:
            got = out[spec.name]
            if isinstance(got, str):
                continue
            value = _guarded(throughput, bench, spec, task, n, extra)
            if isinstance(value, str):
                out[spec.name] = value
                continue
            got.append(value)
            console.print(f"  {task} round {r + 1}: {spec.name} {value:,.0f} jobs/s")
    return out


def faults(bench: Run, present: list[PeerSpec]) -> dict[str, dict[str, dict[str, str] | str]]:
    out: dict[str, dict[str, dict[str, str] | str]] = {}
    for spec in present:
        cls = spec.load()
        if not cls.runs_faults:
            continue
        out[spec.name] = {}
        for fault, fn in FAULTS.items():
            console.print(f"  fault: {spec.name} {fault}")
            cell = _guarded(fn, bench, spec)
            if isinstance(cell, dict):
                cell["feature"] = _feature(cls, fault)
            out[spec.name][fault] = cell
    return out


def _feature(cls: type[Peer], fault: str) -> str:
    if fault.startswith("memory"):
        return cls.memory_feature
    if fault.startswith("hang"):
        return cls.time_limit_feature + (" 5 s" if cls.time_limit_feature != "none" else "")
    if fault.startswith("SIGTERM"):
        return cls.drain_feature
    return "-"


def _guarded(fn: Callable[..., Any], *args: Any) -> Any:
    """Run one measurement; a failure becomes the text of its cell, never the end of the run."""
    try:
        return fn(*args)
    except Exception as exc:
        console.print(f"  [red]{fn.__name__} failed: {type(exc).__name__}: {exc}[/]")
        return f"failed: {type(exc).__name__}"


def machine() -> dict[str, Any]:
    info = {
        "nproc": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "load_before": os.getloadavg(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
    }
    info["summary"] = (
        f"{info['nproc']} CPUs, {info['memory_gib']} GiB, Linux {info['kernel']}, "
        f"Python {info['python']}, {info['date']}, load {info['load_before'][0]:.1f}"
    )
    return info


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    return {k: str(v) if isinstance(v, Path) else v for k, v in d.items()}


# ---- tables ----------------------------------------------------------------------------------


def _median(values: list[float] | str | None) -> float | None:
    return statistics.median(values) if isinstance(values, list) and values else None


def _rate_cell(values: list[float] | str | None) -> str:
    if isinstance(values, str):
        return values
    m = _median(values)
    if m is None:
        return "-"
    spread = f" ({min(values):,.0f}–{max(values):,.0f})" if values and len(values) > 1 else ""
    return f"{m:,.0f}{spread}"


def _ratio(fleetd: float | None, peer: float | None) -> str:
    return f"{fleetd / peer:.2f}" if fleetd and peer else "-"


def quantile(values: list[float], q: int) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def summary_table(
    names: list[str], versions: dict[str, str | None], results: dict[str, Any]
) -> Table:
    """One row per peer; ratios are fleetd (SQLite) ÷ the peer (throughput above 1 and
    latency below 1 favour fleetd)."""
    table = Table(title=f"{WORKERS} worker processes each · ratios: fleetd (SQLite) ÷ peer")
    for col in (
        "queue",
        "version",
        "no-op jobs/s",
        "÷",
        "CPU 20 ms jobs/s",
        "÷",
        "pickup p50",
        "pickup p99",
        "÷ p50",
    ):
        table.add_column(col, justify="left" if col in ("queue", "version") else "right")
    ref = {k: _median(results[k].get("fleetd")) for k in ("throughput", "cpu")}
    ref_p50 = _p(results["pickup"].get("fleetd"), 50)
    for name in names:
        if not versions[name]:
            table.add_row(name, "not installed", *["-"] * 7)
            continue
        tp, cpu = results["throughput"].get(name), results["cpu"].get(name)
        pk = results["pickup"].get(name)
        p50 = _p(pk, 50)
        table.add_row(
            name,
            versions[name] or "",
            _rate_cell(tp),
            _ratio(ref["throughput"], _median(tp)) if name != "fleetd" else "",
            _rate_cell(cpu),
            _ratio(ref["cpu"], _median(cpu)) if name != "fleetd" else "",
            _ms(p50) if not isinstance(pk, str) else pk,
            _ms(_p(pk, 99)),
            _ratio(ref_p50, p50) if name != "fleetd" else "",
        )
    return table


def _p(values: list[float] | str | None, q: int) -> float | None:
    return quantile(values, q) if isinstance(values, list) and values else None


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f} ms"


def fault_table(faults_: dict[str, dict[str, dict[str, str] | str]]) -> Table:
    table = Table(title="faults (each observed for at most --fault-cap seconds)", show_lines=True)
    for col in ("queue", "fault", "configured", "stopped mid-job?", "job's fate", "the rest"):
        table.add_column(col, overflow="fold")
    for name, rows in faults_.items():
        for fault, cell in rows.items():
            if isinstance(cell, str):
                table.add_row(name, fault, "", cell, "", "")
                continue
            stopped = cell["stopped"] + (f"; exit {cell['exit']}" if "exit" in cell else "")
            table.add_row(name, fault, cell["feature"], stopped, cell["fate"], cell["others"])
    return table
