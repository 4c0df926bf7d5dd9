"""Memory counted as the kernel counts it, on both engines: 50 io workers at rest show a
per-worker figure near their private memory (a few MiB) beside the pool's shared baseline,
in ``fleetd status`` (text and JSON) and ``fleetd check``, and the pool's memory ceiling is
computed from them: the budget less the shared baseline, counted once, divided by what one
worker adds."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from tests.integration.fleet import Harness, handlers
from tests.support.wait import eventually

MIB = 1 << 20
WORKERS = 50


def fleetd(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "supervisor", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**__import__("os").environ, "COLUMNS": "160"},  # the wide view, whatever is set
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_fifty_io_workers_count_their_shared_pages_once(fleet: Harness) -> None:
    config = fleet.configure(
        {
            "io": {
                "handlers": handlers("echo"),
                "bound": "io",
                "min_workers": WORKERS,
                "max_workers": 200,
                "job_memory": "46MiB",
                "memory_limit": "256MiB",
            }
        },
        memory_budget="2GiB",
        memory_cgroup=False,
        scale_interval="500ms",
    )
    sup = fleet.start()
    sup.wait_workers(fleet.store, "io", WORKERS)

    def measured() -> dict | None:
        snap = sup.snapshot(fleet.store)
        pool = snap["pools"]["io"] if snap else {}
        return pool if pool.get("shared_baseline") else None

    pool = eventually(measured, timeout=20)
    private, shared = pool["private_at_rest"], pool["shared_baseline"]
    # a few MiB alone; most of it shared (the interpreter, the workers package, the handlers)
    assert private < 8 * MIB and private < shared, (private, shared)
    # the ceiling: (2 GiB - shared) / (46 MiB - shared), far above 2 GiB / 46 MiB = 44
    per_worker = max(46 * MIB - shared, MIB)
    assert pool["ceiling"] == min(200, (2048 * MIB - shared) // per_worker), pool
    assert pool["ceiling"] > 2048 // 46

    text = fleetd("status", "-c", str(config), "--once")
    # the wide table's column: "at rest" with private+shared (a narrow view spells it out)
    assert "at rest" in text and re.search(r"\d+(\.\d+)?M\+\d+(\.\d+)?M", text), text
    status = json.loads(fleetd("status", "-c", str(config), "--json"))
    row = status["pools"]["io"]
    assert row["private_at_rest"] < 8 * MIB and abs(row["shared_baseline"] - shared) < MIB, row

    plan = json.loads(fleetd("check", "-c", str(config), "--json"))["pools"]["io"]
    rest, sizing = plan["memory_at_rest"], plan["sizing"]
    # check forks its worker through a forker too: the same pages shared as the fleet's
    assert rest["private"] < 8 * MIB and abs(rest["shared"] - shared) < 2 * MIB, (rest, shared)
    assert sizing["shared"] == rest["shared"]
    assert sizing["memory"] == (sizing["memory_share"] - rest["shared"]) // sizing["per_worker"]
    assert "at rest: a worker" in fleetd("check", "-c", str(config))


def test_a_full_collection_in_a_worker_copies_none_of_the_supervisors_pages(
    fleet: Harness,
) -> None:
    """Workers freeze what they inherit (gc.freeze): without it a collection walks, writes to
    and so copies the supervisor's objects (measured: 21 MiB of its ~45 MiB)."""
    fleet.configure({"bulk": {"handlers": handlers("gc_copies"), "max_workers": 1}})
    fleet.start()
    (job,) = fleet.wait_final([fleet.enqueue("gc_copies")])
    assert job.state == "done" and job.result["copied_kib"] < 4 * 1024, job.result
