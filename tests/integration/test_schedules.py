"""Schedules with real supervisors on one database (SQLite file, and PostgreSQL).

- three supervisors with ``every = "1s"`` for 6 s: one job per tick, each key once, every
  tick enqueued within a second of its time (leaderless: whoever comes first);
- a supervisor stopped for 5 s and started again: ``catch_up = "skip"`` enqueues no tick of
  the gap, ``"once"`` the latest, ``"all"`` the latest ``catch_up_max``, decided from the
  stored row (three schedules, one per policy, in one config);
- ``overlap = "skip"`` with a job slower than the period: no tick is enqueued while the last
  one's job is queued or running;
- ``fleetd demo`` runs its schedule, and the summary shows the schedule's jobs.

Waits poll the store; the only wait on time itself is the 5 s the supervisor is kept down.
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from supervisor.model import Job
from supervisor.schedules import tick_key
from tests.integration.fleet import REPO, Harness, handlers
from tests.support.wait import eventually

pytestmark = pytest.mark.slow

ECHO_POOL = {"bulk": {"handlers": handlers("echo", "sleep"), "min_workers": 1, "max_workers": 2}}


def ticks_of(fleet: Harness, name: str) -> dict[float, Job]:
    """The schedule's jobs by tick (keys checked: one per tick, and it names the tick)."""
    jobs = [j for j in fleet.store.list_jobs(limit=10_000) if j.key]
    mine = [j for j in jobs if j.key.startswith(f"schedule:{name}:")]
    assert len({j.key for j in mine}) == len(mine)
    out = {}
    for j in mine:
        tick = datetime.fromisoformat(j.payload["scheduled_for"]).timestamp()
        assert j.key == tick_key(name, tick)
        out[tick] = j
    return out


def wait_until(fleet: Harness, moment: float, timeout: float = 30.0) -> None:
    """Until the store's clock reads ``moment``."""
    eventually(lambda: fleet.store.now() >= moment, timeout=timeout)


def test_three_supervisors_enqueue_each_tick_once(fleet: Harness) -> None:
    fleet.configure(ECHO_POOL, {"beat": {"kind": "echo", "every": "1s", "catch_up": "all"}})
    sups = [fleet.start(f"node-{x}") for x in "abc"]
    eventually(lambda: fleet.store.schedule_states(["beat"]).states)  # a pass ran
    t0 = fleet.store.now()
    wait_until(fleet, t0 + 6)
    for sup in sups:
        sup.check_alive()
        sup.stop()
    ticks = ticks_of(fleet, "beat")
    window = sorted(t for t in ticks if t0 < t <= t0 + 6)
    assert 5 <= len(window) <= 7, window
    every = sorted(ticks)
    assert every == [every[0] + k for k in range(len(every))]  # none lost, none twice
    lag = [ticks[t].enqueued_at - t for t in window]
    assert max(lag) < 1.0, lag
    row = fleet.store.schedule_states(["beat"]).states["beat"]
    assert row.last_tick == every[-1] and row.missed == 0


def test_catch_up_after_downtime_is_decided_from_the_stored_row(fleet: Harness) -> None:
    policies = {"gap_skip": "skip", "gap_once": "once", "gap_all": "all"}
    fleet.configure(
        ECHO_POOL,
        {
            name: {
                "kind": "echo",
                "every": "1s",
                "catch_up": policy,
                "catch_up_max": 3,
                "overlap": "allow",
            }
            for name, policy in policies.items()
        },
    )
    sup = fleet.start()
    eventually(lambda: all(len(ticks_of(fleet, n)) >= 2 for n in policies))
    sup.stop()
    last = {n: max(ticks_of(fleet, n)) for n in policies}
    wait_until(fleet, fleet.store.now() + 5)  # down for 5 s
    restarted = fleet.store.now()
    fleet.start()
    eventually(lambda: all(max(ticks_of(fleet, n)) >= restarted + 2 for n in policies))
    for name, policy in policies.items():
        ticks = ticks_of(fleet, name)
        after = sorted(t for t in ticks if t > last[name])
        # the first pass after the restart enqueued the catch-up and the current tick in one
        # transaction: consecutive job ids (the next pass enqueues the other schedules' ticks
        # before this one's next). Not by enqueued_at: a tick due while that transaction ran
        # is the next pass's, though its time may come before the first pass's inserts
        by_id = sorted((ticks[t].id, t) for t in after)
        first_advance = [by_id[0][1]]
        for (prev, _), (job_id, tick) in itertools.pairwise(by_id):
            if job_id != prev + 1:
                break
            first_advance.append(tick)
        current = max(first_advance)
        gap = sorted(t for t in first_advance if t < current)
        assert current - last[name] >= 5, (name, last[name], current)  # down for 5 s
        expected = {"skip": [], "once": [current - 1], "all": [current - k for k in (3, 2, 1)]}
        assert gap == expected[policy], (name, gap, current)
        row = fleet.store.schedule_states([name]).states[name]
        assert row.missed >= current - last[name] - 1 - len(gap), (name, row.missed)


def test_overlap_skip_waits_for_the_running_tick(fleet: Harness) -> None:
    fleet.configure(
        ECHO_POOL,
        {
            "slow": {
                "kind": "sleep",
                "every": "1s",
                "payload": {"seconds": 2.5, "log": str(fleet.exec_log)},
                "overlap": "skip",
                "catch_up": "skip",
            }
        },
    )
    sup = fleet.start()
    eventually(lambda: sum(r["outcome"] == "ok" for r in fleet.executions()) >= 2, timeout=30)
    sup.stop()
    jobs = [ticks_of(fleet, "slow")[t] for t in sorted(ticks_of(fleet, "slow"))]
    runs = sorted(fleet.executions(), key=lambda r: r["start"])
    for earlier, later in itertools.pairwise(runs):
        assert later["start"] >= earlier["end"], (earlier, later)  # never two at once
    for earlier, later in itertools.pairwise(jobs):
        assert earlier.finished_at is not None and later.enqueued_at >= earlier.finished_at
    row = fleet.store.schedule_states(["slow"]).states["slow"]
    assert row.missed >= 2  # ticks skipped while a job ran


def test_the_demo_runs_a_schedule(tmp_path: Path) -> None:
    for name in ("demo.toml", "demo_jobs.py"):
        shutil.copy(REPO / "conf" / name, tmp_path / name)
    proc = subprocess.run(
        [sys.executable, "-m", "supervisor", "demo", "-c", str(tmp_path / "demo.toml")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("schedule sync"))
    enqueued = int(line.split(": ")[1].split()[0])
    assert enqueued >= 3 and "done" in line, line
    listed = subprocess.run(
        [sys.executable, "-m", "supervisor", "schedules", "-c", str(tmp_path / "demo.toml")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert "sync" in listed.stdout and "every 2s" in listed.stdout, listed.stdout
