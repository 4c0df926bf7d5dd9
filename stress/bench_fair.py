"""The plain claim against the fair claim, and this tree against another (main), interleaved.

For each engine and queue size (10,000 and 1,000,000 by default), one database holds three pools
of that many ready jobs each: ``one`` (every job of one tenant), ``many`` (1,000 tenants, jobs
enqueued round-robin) and ``none`` (jobs without a tenant; only at the smaller size: that is the
pool that must pay nothing). Each variant is a fresh process that times ``cycles`` claims of
``n`` = 4 jobs, each followed by an untimed release (so the queue keeps its depth):

- ``base plain``: the other tree's plain claim (``--base``: a checkout with its own virtualenv,
  e.g. /work/main), ``limits`` None: one statement, SKIP LOCKED on PostgreSQL;
- ``plain``: this tree's claim of a pool with ``fair = false`` (``limits`` None);
- ``fair``: this tree's claim of a pool with the default ``fair = true`` (``ClaimLimits()``):
  the plain statement guarded by two index probes while one tenant is queued (then, for
  ``fair.GUARD_EVERY``, without them), the serialised fair claim (fair.py) while more are;
- ``fair guarded``: the same, with the guard run on every claim (the store forgets before each
  claim that it found one tenant): what the guard itself costs.

Variants run in rounds, in a rotating order, so a load that comes and goes on a shared machine
falls on all of them; each result is the median over rounds of each round's median. PostgreSQL's
table is vacuumed before every process, as the reaper's vacuum keeps it in a running fleet.

``--concurrent K`` (PostgreSQL): K processes claim (n = 4) and release in a loop for
``--seconds`` on the 1,000-tenant pool, fair and plain: fair claims of one pool are
serialised (an advisory lock), plain ones are not; the total claims per second say what that
costs.

Examples::

    python -m stress bench-fair --base /work/main
    python -m stress bench-fair --engine sqlite --sizes 10000 --rounds 3
    python -m stress bench-fair --engine postgres --sizes 10000 --concurrent 4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HELP = "plain claim vs fair claim (1 and 1,000 tenants, 10k and 1M queued), main vs this tree"
POSTGRES_ENV = "FLEETD_TEST_POSTGRES_URL"
DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1/test"
KIND = "render"
HERE = Path(__file__).resolve()
TREE = HERE.parents[1]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--postgres-url", default=os.environ.get(POSTGRES_ENV, DEFAULT_POSTGRES))
    parser.add_argument("--sizes", default="10000,1000000", help="ready jobs per pool")
    parser.add_argument("--tenants", type=int, default=1000, help="tenants of the pool 'many'")
    parser.add_argument("--base", help="another checkout (with .venv) to compare: e.g. main")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cycles", type=int, default=200, help="claims timed per process")
    parser.add_argument("-n", type=int, default=4, help="jobs per claim")
    parser.add_argument("--concurrent", type=int, default=0, help="claimers at once (PostgreSQL)")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--json", action="store_true", help="one JSON object per result")


def _fill(url: str, size: int, tenants: int, *, untenanted: bool) -> None:
    """The pools ``one``, ``many`` (and ``none``) with ``size`` ready jobs each; statistics.
    The first 10,000 of each pool are enqueued through the store; the rest are copies of them
    made by the database (INSERT ... SELECT, doubling), which fills a million rows in seconds
    instead of minutes: the rows are the ones enqueue wrote, tenants in the same rotation."""
    from sqlalchemy import func, insert, select

    from supervisor.model import NewJob
    from supervisor.store import open_store
    from supervisor.store.schema import jobs

    store = open_store(url)
    try:
        pools = {"one": lambda i: "acme", "many": lambda i: f"t{i % tenants:05d}"}
        if untenanted:
            pools["none"] = lambda i: None
        copied = [c for c in jobs.c if c.name != "id"]
        for pool, tenant in pools.items():
            first = min(size, 10_000)
            store.enqueue_many(
                [NewJob(KIND, pool, "{}", 3, tenant=tenant(i)) for i in range(first)]
            )
            have = first
            while have < size:
                more = min(have, size - have)
                rows = select(*copied).where(jobs.c.pool == pool).order_by(jobs.c.id).limit(more)
                with store.engine.begin() as conn:
                    conn.execute(insert(jobs).from_select([c.name for c in copied], rows))
                have += more
        with store.engine.begin() as conn:
            count = conn.execute(select(func.count()).select_from(jobs)).scalar_one()
            assert count == size * len(pools), (count, size, len(pools))
            conn.exec_driver_sql("ANALYZE")
    finally:
        store.close()


def _vacuum(url: str) -> None:
    if not url.startswith("postgresql"):
        return
    from supervisor.store import open_store

    store = open_store(url, migrate=False)
    try:
        with store.engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(
                "VACUUM ANALYZE fleetd_jobs"
            )
    finally:
        store.close()


def _claimer(url: str, pool: str, mode: str, cycles: int, n: int) -> dict[str, float]:
    """In a process of the tree being measured: ``cycles`` timed claims, each released."""
    from supervisor.model import ClaimLimits
    from supervisor.store import open_store

    store = open_store(url, migrate=False)
    limits = ClaimLimits() if mode != "0" else None
    times = []
    try:
        for _ in range(cycles):
            if mode == "2":
                store._one_tenant_at.clear()
            start = time.perf_counter()
            got = store.claim(pool=pool, kinds={KIND}, n=n, node="b", lease=300.0, limits=limits)
            times.append(time.perf_counter() - start)
            if len(got) != n:
                raise SystemExit(f"claimed {len(got)} of {n}: the queue is not what it should be")
            store.release([c.lease for c in got])
    finally:
        store.close()
    return {"median_ms": statistics.median(times) * 1e3}


def _loop(url: str, pool: str, fair: bool, seconds: float, n: int) -> dict[str, float]:
    """In a process: claim and release for ``seconds``; how many claims."""
    from supervisor.model import ClaimLimits
    from supervisor.store import open_store

    store = open_store(url, migrate=False)
    limits = ClaimLimits() if fair else None
    claims, end = 0, time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            got = store.claim(pool=pool, kinds={KIND}, n=n, node="b", lease=300.0, limits=limits)
            store.release([c.lease for c in got])
            claims += 1
    finally:
        store.close()
    return {"claims": claims}


def _spawn(python: str, tree: Path, *argv: str) -> subprocess.Popen[str]:
    """This file as a script, run by ``python`` from ``tree``: sys.path[0] is stress/, so
    ``supervisor`` comes from that interpreter's own install (its checkout)."""
    return subprocess.Popen(
        [python, str(HERE), "--child", *argv], cwd=tree, stdout=subprocess.PIPE, text=True
    )


def _result(proc: subprocess.Popen[str]) -> dict[str, float]:
    out, _ = proc.communicate(timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"a claimer failed (exit {proc.returncode})")
    return json.loads(out.strip().splitlines()[-1])


def _variants(args: argparse.Namespace) -> list[tuple[str, str, Path, str]]:
    """(name, python, tree, mode) for each process kind (mode: 0 plain, 1 fair, 2 fair with
    the guard on every claim)."""
    mine = sys.executable
    variants = [("plain", mine, TREE, "0"), ("fair", mine, TREE, "1")]
    variants.append(("fair guarded", mine, TREE, "2"))
    if args.base:
        base = Path(args.base)
        variants.insert(0, ("base plain", str(base / ".venv" / "bin" / "python"), base, "0"))
    return variants


def _measure(engine: str, url: str, size: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    untenanted = size <= 10_000
    started = time.monotonic()
    _fill(url, size, args.tenants, untenanted=untenanted)
    filled = time.monotonic() - started
    print(f"# {engine} {size:,}: filled in {filled:.0f}s", file=sys.stderr, flush=True)
    pools = ["one", "many"] + (["none"] if untenanted else [])
    variants = _variants(args)
    out = []
    for pool in pools:
        medians: dict[str, list[float]] = {name: [] for name, *_ in variants}
        for round_ in range(args.rounds):
            shift = round_ % len(variants)
            for name, python, tree, fair in variants[shift:] + variants[:shift]:
                _vacuum(url)
                argv = ("claims", url, pool, fair, str(args.cycles), str(args.n))
                medians[name].append(_result(_spawn(python, tree, *argv))["median_ms"])
        for name, values in medians.items():
            about = {"engine": engine, "size": size, "pool": pool, "claim": name}
            out.append({**about, "median_ms": statistics.median(values), "rounds": values})
    return out


def _concurrent(url: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    out = []
    for round_ in range(args.rounds):
        for fair in (False, True) if round_ % 2 == 0 else (True, False):
            _vacuum(url)
            argv = ("loop", url, "many", str(int(fair)), str(args.seconds), str(args.n))
            procs = [_spawn(sys.executable, TREE, *argv) for _ in range(args.concurrent)]
            claims = sum(_result(p)["claims"] for p in procs)
            out.append({"fair": fair, "claims_per_s": claims / args.seconds})
    summary = []
    for fair in (False, True):
        rates = [r["claims_per_s"] for r in out if r["fair"] is fair]
        summary.append(
            {
                "claimers": args.concurrent,
                "claim": "fair" if fair else "plain",
                "claims_per_s": statistics.median(rates),
                "rounds": rates,
            }
        )
    return summary


def run(args: argparse.Namespace) -> int:
    # imported here: the timed children run this file by path, in another tree too
    from stress.bench_e2e import scratch_database

    engines = ("sqlite", "postgres") if args.engine == "both" else (args.engine,)
    results, concurrent = [], []
    for engine in engines:
        for size in [int(s) for s in args.sizes.split(",")]:
            with scratch_database(engine, args.postgres_url, "fair") as (_, url):
                results += _measure(engine, url, size, args)
                if args.concurrent and engine == "postgres":
                    concurrent += [{**r, "size": size} for r in _concurrent(url, args)]
    if args.json:
        for r in results + concurrent:
            print(json.dumps(r))
        return 0
    print(f"claims of n = {args.n}, median of {args.rounds} rounds of {args.cycles} each")
    print(f"{'engine':9} {'queued':>9} {'pool':5} {'claim':11} {'median':>8}  vs base plain")
    base = {
        (r["engine"], r["size"], r["pool"]): r["median_ms"]
        for r in results
        if r["claim"] == "base plain"
    }
    for r in results:
        ref = base.get((r["engine"], r["size"], r["pool"]))
        ratio = f"{r['median_ms'] / ref:.2f}x" if ref else ""
        print(
            f"{r['engine']:9} {r['size']:9,} {r['pool']:5} {r['claim']:11} "
            f"{r['median_ms']:7.3f}ms  {ratio}"
        )
    for r in concurrent:
        print(
            f"postgres {r['size']:9,} many: {r['claimers']} claimers at once, {r['claim']}: "
            f"{r['claims_per_s']:,.0f} claims/s"
        )
    return 0


def _child(argv: list[str]) -> None:
    what, url, pool, fair, amount, n = argv
    if what == "claims":
        result = _claimer(url, pool, fair, int(amount), int(n))
    else:
        result = _loop(url, pool, fair == "1", float(amount), int(n))
    print(json.dumps(result))


if __name__ == "__main__" and sys.argv[1:2] == ["--child"]:
    _child(sys.argv[2:])
