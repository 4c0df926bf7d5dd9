"""Fresh workers (issue 14), the pure parts: how many rooms a claim may fill while a pool keeps
a spare, when a pool keeps one, and what a worker costs the memory ceiling."""

from __future__ import annotations

import pytest

from supervisor.config.pool import PoolConfig
from supervisor.plans import Room, within_cap
from supervisor.policy import PoolSizing, ceilings, worker_cost
from supervisor.run.pool import Pool

MIB = 1 << 20


@pytest.mark.parametrize(
    ("rooms", "cap", "expected"),
    [
        ([Room(1, 0), Room(1, 0), Room(1, 0)], None, 3),  # no spare: every worker
        ([Room(1, 0), Room(1, 0), Room(1, 0)], 2, 2),  # the spare stays idle
        ([Room(0, 1), Room(1, 0), Room(1, 0)], 2, 2),  # one busy: one idle more
        ([Room(0, 1), Room(0, 1), Room(1, 0)], 2, 2),  # two busy: no idle one
        ([Room(1, 0)], 0, 0),
    ],
)
def test_within_cap(rooms: list[Room], cap: int | None, expected: int) -> None:
    kept = within_cap(rooms, cap)
    assert len(kept) == expected
    assert all(r in kept for r in rooms if r.held)  # a busy worker's room is never dropped


@pytest.mark.parametrize(
    ("recycle", "target", "ceiling", "spares"),
    [
        (1, 2, 3, 1),  # a fresh worker per job, room under the ceiling: one spare
        (10, 2, 3, 1),
        (11, 2, 3, 0),  # recycles rarely: no spare
        (False, 2, 3, 0),  # never recycles
        (1, 3, 3, 0),  # at the ceiling: a spare would pass it
        (1, 0, 3, 0),  # scaled to zero: nothing kept
    ],
)
def test_spares(recycle: int | bool, target: int, ceiling: int, spares: int) -> None:
    config = PoolConfig(name="p", handlers={"k": "m:f"}, max_workers=5, max_jobs_per_worker=recycle)
    pool = Pool(config, {}, 1)
    pool.target, pool.ceiling = target, ceiling
    assert pool.spares() == spares
    assert pool.wanted() == target + spares
    assert pool.running_cap() == (target if spares else None)


def test_the_memory_ceiling_counts_the_shared_baseline_once() -> None:
    budget = 2048 * MIB
    plain = PoolSizing("io", "io", 50, 1000, 46 * MIB)
    shared = PoolSizing("io", "io", 50, 1000, 46 * MIB, shared=43 * MIB)
    before = ceilings([plain], cores=2, memory_budget=budget)["io"]
    after = ceilings([shared], cores=2, memory_budget=budget)["io"]
    assert before.memory == budget // (46 * MIB) == 44
    assert after.per_worker == worker_cost(46 * MIB, 43 * MIB) == 3 * MIB
    assert after.memory == (budget - 43 * MIB) // (3 * MIB) == 668
    assert worker_cost(10 * MIB, 43 * MIB) == MIB  # never below the floor
