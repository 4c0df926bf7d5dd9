"""Memory bombs in one pool are stopped, dead-lettered with a precise reason, and cost the
host nothing, while the neighbouring pool carries on."""

from __future__ import annotations

import psutil
import pytest

from supervisor.model import ErrorKind, JobState
from tests.integration.fleet import Harness, handlers

pytestmark = pytest.mark.slow

MIB = 1024 * 1024
LIMIT_MIB = 256
MAX_DELIVERIES = 3


def test_memory_bombs_are_stopped_while_the_neighbouring_pool_completes(
    fleet: Harness,
) -> None:
    fleet.configure(
        {
            "poison": {
                "handlers": handlers("gradual_bomb", "instant_bomb"),
                "min_workers": 2,
                "max_workers": 2,
                "memory_limit": f"{LIMIT_MIB}MiB",
                "max_deliveries": MAX_DELIVERIES,
                "retry_backoff": "50ms",
                "retry_backoff_max": "100ms",
                "timeout": "20s",
            },
            "steady": {
                "handlers": handlers("echo", "sleep"),
                "min_workers": 2,
                "max_workers": 2,
            },
        }
    )
    sup = fleet.start()
    # 50 MiB every 50 ms toward 4 GiB, and bytearray(8 GiB): the handlers' defaults.
    gradual = fleet.enqueue("gradual_bomb", {})
    instant = fleet.enqueue("instant_bomb", {})
    steady = [
        fleet.enqueue("echo", {"n": n}) if n % 2 else fleet.enqueue("sleep", {"seconds": 0.05})
        for n in range(20)
    ]

    jobs = fleet.wait_final([gradual, instant, *steady], timeout=40, watch=[sup])
    by_id = {j.id: j for j in jobs}

    for bomb in (by_id[gradual], by_id[instant]):
        assert bomb.state == JobState.DEAD, bomb
        assert bomb.error_kind == ErrorKind.MEMORY_LIMIT, bomb
        assert bomb.attempts == MAX_DELIVERIES, bomb
        assert f"{LIMIT_MIB}" in (bomb.last_error or ""), bomb.last_error
        # the host untouched: nothing came near the 4 GiB and 8 GiB the bombs asked for
        assert bomb.peak_rss is not None and bomb.peak_rss < 512 * MIB, bomb
    # the instant bomb's allocation is refused in the worker (the rlimit): it says so, every time
    instant_runs = fleet.executions(instant)
    assert [r["outcome"] for r in instant_runs] == ["raised"] * MAX_DELIVERIES
    assert "allocation refused" in (by_id[instant].last_error or "")

    for job_id in steady:
        job = by_id[job_id]
        assert job.state == JobState.DONE and job.attempts == 1, job
    assert [by_id[j].result["n"] for j in steady[1::2]] == list(range(1, 20, 2))

    sup.check_alive()
    assert psutil.Process(sup.pid).memory_info().rss < 256 * MIB  # the supervisor itself
