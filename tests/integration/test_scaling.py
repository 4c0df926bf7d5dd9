"""A pool that sizes itself: a burst of jobs on an io pool (min 1, max 8, a latency target of
a few seconds) scales it out within two evaluations, clears the backlog within the target,
then scales it back in after the cooldown, with few scale events (no flapping)."""

from __future__ import annotations

import re
from datetime import datetime

import pytest

from supervisor.model import JobState
from tests.integration.fleet import Harness, handlers
from tests.support.wait import eventually

pytestmark = pytest.mark.slow

INTERVAL = 0.5
TARGET = 4.0
JOBS = 40
SERVICE = 0.3
# a log line's local time to the millisecond, then the first scale-out of pool io
SCALE_OUT = re.compile(r"^(\S+ \S+) .*pool io: 1 -> \d+ workers", re.M)


def workers(fleet: Harness, sup) -> int:
    return len([w for w in sup.workers(fleet.store, "io") if w["state"] != "stopping"])


def test_a_burst_scales_out_clears_within_the_target_and_scales_back_in(fleet: Harness) -> None:
    fleet.configure(
        {
            "io": {
                "handlers": handlers("sleep"),
                "bound": "io",
                "min_workers": 1,
                "max_workers": 8,
                "latency_target": f"{TARGET}s",
                "scale_in_cooldown": "2s",
            }
        },
        scale_interval=f"{INTERVAL}s",
    )
    sup = fleet.start()
    eventually(lambda: workers(fleet, sup) == 1)
    ids = fleet.client.enqueue_many([("sleep", {"seconds": SERVICE}) for _ in range(JOBS)])
    first = fleet.job(ids[0])

    # out within two evaluations (plus one for the tick's phase), read off the log line's own
    # time: the workers' snapshot is published once a second, so polling it adds up to 1.2 s
    line = eventually(lambda: SCALE_OUT.search(sup.log()), timeout=30)
    at = datetime.strptime(line.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    assert at - first.enqueued_at <= 3 * INTERVAL, line.group(0)
    jobs = fleet.wait_final(ids, timeout=30, watch=[sup])
    assert all(j.state == JobState.DONE for j in jobs)
    cleared = max(j.started_at or 0.0 for j in jobs) - first.enqueued_at
    assert cleared <= TARGET, f"the last job waited {cleared:.1f}s (target {TARGET}s)"
    one_worker_time = JOBS * SERVICE
    assert cleared < one_worker_time / 2  # it really scaled: one worker needs 12 s

    eventually(lambda: workers(fleet, sup) == 1, timeout=30)  # back to min_workers
    events = re.findall(r"pool io: (\d+) -> (\d+) workers", sup.log())
    ups = [e for e in events if int(e[1]) > int(e[0])]
    assert 1 <= len(ups) <= 4, events  # out in a few doubling steps
    assert len(events) <= 12, events  # in one step at a time, no flapping back out
    downs_then_ups = [
        i
        for i in range(1, len(events))
        if int(events[i][1]) > int(events[i][0]) and int(events[i - 1][1]) < int(events[i - 1][0])
    ]
    assert not downs_then_ups, events
