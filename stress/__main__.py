"""``python -m stress <command>``: fleetd's benchmarks and stress runs.

Each command is a module in this package listed in ``COMMANDS``. A command module provides:

- ``HELP``: a one-line summary for ``python -m stress --help``;
- ``add_arguments(parser)``: its options, on an ``argparse`` sub-parser;
- ``run(args) -> int``: the command itself; its return value is the exit code.

To add a command, write such a module and add one line to ``COMMANDS``. Modules are imported
only when their command runs, so one command's imports never slow down or break another's.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

from supervisor.errors import StoreUnavailable

# command name -> (module, one-line help). The help lives here so --help imports nothing.
COMMANDS: dict[str, tuple[str, str]] = {
    "bench-store": (
        "stress.bench_store",
        "store throughput and latency: enqueue, claim+ack, stats, claim-cost flatness",
    ),
    "bench-isolation": (
        "stress.bench_isolation",
        "interactive pickup latency with a deep bulk backlog vs an idle fleet",
    ),
    "bench-e2e": (
        "stress.bench_e2e",
        "end to end: no-op throughput and idle pickup latency through fleetd start",
    ),
    "bench-bare": (
        "stress.bench_bare",
        "the bare reference: a minimal claim/feed/ack loop that fleetd's figures are read against",
    ),
    "bench-incr": (
        "stress.bench_incr",
        "one Redis INCR a job through fleetd start, beside the bare INCR loop",
    ),
    "bench-fresh": (
        "stress.bench_fresh",
        "a fresh worker per job: max_jobs_per_worker = 1 beside a bare fork-per-job loop",
    ),
    "bench-worker": (
        "stress.bench_worker",
        "one worker's CPU per no-op job, fed as the loop feeds a pipelining pool",
    ),
    "bench-caps": (
        "stress.bench_caps",
        "claim cost with fleet-wide caps and fair shares, at depth and with many tenants",
    ),
    "bench-finals": (
        "stress.bench_finals",
        "the result path's cost of waking waiters: ack with and without it, A/B in one process",
    ),
    "bench-slots": (
        "stress.bench_slots",
        "slots: 500 concurrent 1 s sleeps as 500 one-slot workers vs 25 workers x 20 slots",
    ),
    "bench-fair": (
        "stress.bench_fair",
        "plain claim vs fair claim (1 and 1,000 tenants, 10k and 1M queued), main vs this tree",
    ),
    "bench": ("stress.bench_peers", "fleetd against Celery, RQ, Dramatiq, procrastinate"),
    "chaos": (
        "stress.chaos",
        "faults on a seeded schedule against real supervisors; invariants checked",
    ),
}


def _module(name: str) -> ModuleType:
    return importlib.import_module(COMMANDS[name][0])


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, hand the rest to the command's module, return its exit code."""
    parser = argparse.ArgumentParser(prog="python -m stress", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (_, summary) in COMMANDS.items():
        sub.add_parser(name, help=summary, add_help=False)
    args, rest = parser.parse_known_args(argv)
    module = _module(args.command)
    command = argparse.ArgumentParser(
        prog=f"python -m stress {args.command}", description=module.__doc__
    )
    command.formatter_class = argparse.RawDescriptionHelpFormatter
    module.add_arguments(command)
    parsed = command.parse_args(rest)
    try:
        return int(module.run(parsed))
    except (StoreUnavailable, *_unreachable()) as exc:  # a database the command cannot reach
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"python -m stress {args.command}: database unavailable: {first}", file=sys.stderr)
        return 2


def _unreachable() -> tuple[type[Exception], ...]:
    """The drivers' errors for a database that cannot be reached or opened (a command may use
    a driver directly); their other errors are bugs and keep their traceback."""
    import sqlite3

    try:
        import psycopg
    except ImportError:  # installed with the postgres or dev extra only
        return (sqlite3.OperationalError,)
    return (sqlite3.OperationalError, psycopg.OperationalError)


if __name__ == "__main__":
    sys.exit(main())
