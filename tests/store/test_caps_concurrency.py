"""Several real processes claim from one capped pool at once: the pool cap and the tenant cap
hold however the claims interleave, on SQLite and on PostgreSQL.

Three spawned processes (each with its own store) claim with ``max_inflight = 3`` and
``tenant_max_inflight = 1`` from jobs of six tenants, hold each job a few milliseconds, and ack
it. Each records, per job, the moment its claim returned and the moment before its ack, on the
host's monotonic clock (shared by every process). That interval lies inside the time the job was
really leased, so more than 3 (or more than 1 of a tenant) of them overlapping would prove a cap
broken. The interval from before the claim to after the ack contains the lease; those must
overlap (the processes really competed).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import queue
import random
import time
from typing import Any

import pytest

from supervisor.model import Ack, ClaimLimits, JobState, NewJob
from supervisor.store import open_store

TENANTS = 6
PER_TENANT = 12
PROCESSES = 3
CAPS = ClaimLimits(max_inflight=3, tenant_max_inflight=1)
DEADLINE = 90.0


def worker(url: str, index: int, start: Any, results: Any) -> None:
    """Child: claim (2 at a time), hold, ack, until the queue is empty; report the intervals."""
    store = open_store(url)
    rng = random.Random(index)
    spans: list[tuple[str, float, float, float, float]] = []  # tenant, outer/inner start/end
    try:
        start.wait(timeout=DEADLINE)
        while True:
            before = time.monotonic()
            got = store.claim(
                pool="bulk", kinds={"render"}, n=2, node=f"p{index}", lease=300, limits=CAPS
            )
            claimed = time.monotonic()
            if not got:
                if store.stats(["bulk"])["bulk"].ready == 0:
                    break  # nothing left to claim (nothing fails, so nothing comes back)
                time.sleep(0.002)  # at a cap: another process holds the room
                continue
            time.sleep(rng.uniform(0.005, 0.02))
            acking = time.monotonic()
            lost = store.ack([Ack(c.lease) for c in got])
            after = time.monotonic()
            assert not lost
            spans += [(c.tenant or "", before, claimed, acking, after) for c in got]
        results.put((index, spans, None))
    except BaseException as exc:
        results.put((index, spans, repr(exc)))
    finally:
        store.close()


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The largest number of intervals open at one moment (an end before a start at a tie)."""
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    best = level = 0
    for _, step in events:
        level += step
        best = max(best, level)
    return best


@pytest.mark.slow
def test_pool_and_tenant_caps_hold_under_concurrent_claims(db_url: str) -> None:
    store = open_store(db_url)
    try:
        store.enqueue_many(
            [
                NewJob("render", "bulk", json.dumps({}), 3, tenant=f"t{t}")
                for _ in range(PER_TENANT)
                for t in range(TENANTS)
            ]
        )
    finally:
        store.close()

    ctx = mp.get_context("spawn")
    # every child opens its store, then all start together (a spawned child takes a second to
    # import: a gate opened by the parent would open before the first one got there)
    start, results = ctx.Barrier(PROCESSES), ctx.Queue()
    procs = [ctx.Process(target=worker, args=(db_url, i, start, results)) for i in range(PROCESSES)]
    for p in procs:
        p.start()
    spans = []
    try:
        for _ in procs:
            index, got, error = results.get(timeout=DEADLINE)
            assert error is None, f"process {index} failed: {error}"
            spans += got
    except queue.Empty:
        pytest.fail(f"the processes did not finish within {DEADLINE}s")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()

    assert len(spans) == TENANTS * PER_TENANT, "every job ran exactly once"
    inner = [(a, b) for _, _, a, b, _ in spans]
    outer = [(a, b) for _, a, _, _, b in spans]
    assert most_at_once(inner) <= 3, "the pool cap was broken"
    for t in range(TENANTS):
        mine = [(a, b) for tenant, _, a, b, _ in spans if tenant == f"t{t}"]
        assert most_at_once(mine) <= 1, f"the tenant cap of t{t} was broken"
    assert most_at_once(outer) >= 3, "the processes never competed"

    store = open_store(db_url)
    try:
        rows = store.list_jobs(limit=1000)
    finally:
        store.close()
    assert {r.state for r in rows} == {JobState.DONE} and {r.attempts for r in rows} == {1}
