"""Sizing and scaling decisions (supervisor.policy): tables, a fake clock, no I/O."""

from __future__ import annotations

import pytest

from supervisor.policy import (
    PoolSizing,
    ScaleState,
    ceilings,
    desired_slots,
    host_share,
    next_target,
    peak_per_job,
    saturated,
)

MiB = 1024 * 1024


@pytest.mark.parametrize(
    ("arrival", "service", "backlog", "target", "oldest", "expected"),
    [
        (12, 0.8, 9000, 300, 0, 48),  # the seed: (12 + 9000/300) x 0.8 / 0.7
        (0, 1.0, 0, 60, 0, 0),  # nothing to do
        (10, 0.1, 0, 60, 0, 2),  # keep up only: 10 x 0.1 / 0.7 = 1.43
        (0, 1.0, 70, 10, 0, 10),  # clear 70 in 10 s: 7/s x 1 / 0.7
        (0, 1.0, 70, 10, 5, 20),  # the oldest already waited 5 s: 5 s left
        (0, 1.0, 70, 10, 50, 100),  # past the target: a tenth of it, not zero or negative
    ],
)
def test_desired_slots(arrival, service, backlog, target, oldest, expected) -> None:
    assert desired_slots(arrival, service, backlog, target, 0.7, oldest) == expected


def pool(name="p", bound="cpu", mx=8, job=100 * MiB, peaks=(), inflight=None) -> PoolSizing:
    return PoolSizing(name, bound, 1, mx, job, tuple(peaks), inflight)


def test_cpu_pools_share_the_cores_and_io_pools_do_not_count() -> None:
    out = ceilings(
        [pool("a", mx=8), pool("b", mx=8), pool("c", bound="io", mx=8)],
        cores=4,
        memory_budget=100_000 * MiB,
    )
    assert (out["a"].cpu, out["b"].cpu, out["c"].cpu) == (2, 2, None)
    assert out["a"].value == 2 and out["a"].binding == "cpu"
    assert out["c"].value == 8 and out["c"].binding == "max_workers"


def test_memory_budget_is_shared_by_demand_and_divided_by_the_peak() -> None:
    out = ceilings(
        [pool("a", bound="io", mx=10, job=100 * MiB), pool("b", bound="io", mx=10, job=300 * MiB)],
        cores=2,
        memory_budget=1000 * MiB,
    )
    # demand 1000 MiB vs 3000 MiB: a gets 250 MiB (2 jobs), b 750 MiB (2 jobs)
    assert (out["a"].memory, out["b"].memory) == (2, 2)
    assert out["a"].binding == "memory" and out["a"].memory_share == 250 * MiB


def test_max_inflight_binds_a_downstream_pool() -> None:
    out = ceilings([pool(bound="io", mx=50, inflight=5)], cores=2, memory_budget=10**12)
    assert out["p"].value == 5 and out["p"].binding == "max_inflight"


@pytest.mark.parametrize(
    ("rate", "service", "nodes", "inflight", "value", "binding"),
    [
        (50.0, 0.2, 1, None, 15, "rate"),  # the seed's API: 50/s x 200 ms / 0.7 = 14.3
        (50.0, 0.2, 3, None, 5, "rate"),  # three live nodes: this host's share
        (50.0, 2.0, 1, None, 50, "max_workers"),  # slow calls: 143 would be allowed
        (50.0, 0.2, 1, 10, 10, "max_inflight"),  # a cap below it binds first
        (50.0, None, 1, None, 50, "max_workers"),  # no service time measured: no figure
        (None, 0.2, 1, None, 50, "max_workers"),  # no rate limit
    ],
)
def test_a_rate_limit_ceilings_the_pool_at_the_concurrency_it_allows(
    rate, service, nodes, inflight, value, binding
) -> None:
    sizing = PoolSizing(
        "p", "io", 1, 50, MiB, (), inflight, 0, rate_limit=rate, service_time=service, nodes=nodes
    )
    (out,) = ceilings([sizing], cores=2, memory_budget=10**12).values()
    assert (out.value, out.binding) == (value, binding)
    assert out.rate == (None if rate is None or service is None else out.rate)


def test_peak_per_job_is_configured_until_measured_then_a_high_percentile() -> None:
    assert peak_per_job(pool(job=100 * MiB, peaks=[10 * MiB] * 19)) == (100 * MiB, "configured")
    peaks = [20 * MiB] * 19 + [900 * MiB]  # one big document in a stream of small ones
    assert peak_per_job(pool(peaks=peaks)) == (900 * MiB, "measured")
    assert peak_per_job(pool(peaks=[20 * MiB] * 200 + [900 * MiB]))[0] == 20 * MiB  # 0.5 %


@pytest.mark.parametrize(
    ("current", "desired", "ceiling", "minimum", "expected"),
    [
        (1, 48, 100, 1, 2),  # out: at most doubling
        (2, 48, 100, 1, 4),
        (32, 48, 100, 1, 48),
        (4, 48, 6, 1, 6),  # never past the ceiling
        (3, 3, 10, 1, 3),
        (0, 0, 10, 2, 1),  # up to min_workers
        (8, 2, 4, 1, 4),  # the ceiling fell: down at once
    ],
)
def test_next_target_scales_out_fast(current, desired, ceiling, minimum, expected) -> None:
    assert next_target(current, desired, ceiling, minimum, ScaleState(), 0.0, 60.0)[0] == expected


def test_next_target_scales_in_only_after_the_cooldown_one_step_at_a_time() -> None:
    state = ScaleState()
    target, state = next_target(6, 1, 10, 1, state, now=0.0, cooldown=60.0)
    assert target == 6 and state.below_since == 0.0
    target, state = next_target(6, 1, 10, 1, state, now=59.0, cooldown=60.0)
    assert target == 6
    target, state = next_target(6, 1, 10, 1, state, now=60.0, cooldown=60.0)
    assert target == 5
    target, state = next_target(5, 1, 10, 1, state, now=62.0, cooldown=60.0)
    assert target == 4
    # desired came back up: the cooldown starts over
    target, state = next_target(4, 4, 10, 1, state, now=63.0, cooldown=60.0)
    assert target == 4 and state.below_since is None
    target, state = next_target(4, 1, 10, 1, state, now=64.0, cooldown=60.0)
    assert target == 4 and state.below_since == 64.0


@pytest.mark.parametrize(
    ("total", "nodes", "share"), [(48, 1, 48), (48, 5, 10), (0, 3, 0), (5, 0, 5)]
)
def test_host_share(total, nodes, share) -> None:
    assert host_share(total, nodes) == share


@pytest.mark.parametrize(
    ("current", "ceiling", "age", "target", "expected"),
    [(5, 5, 301, 300, True), (5, 5, 299, 300, False), (4, 5, 900, 300, False)],
)
def test_saturated_only_at_the_ceiling_and_behind(current, ceiling, age, target, expected) -> None:
    assert saturated(current, ceiling, age, target) is expected
