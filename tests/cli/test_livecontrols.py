"""The live view's actions on a real store, SQLite and PostgreSQL: each key's store verb, the
line it says, a refusal of the store said as a line (never raised; a database that is away is
shown in a real terminal by tests/integration/test_status_keys.py), and the dead letters of a
pool with the ``/`` filter (a kind or a tenant)."""

from __future__ import annotations

import json
from typing import Any

from supervisor.livecontrols import LiveControls
from supervisor.model import ErrorKind, Failure, JobState, NewJob
from supervisor.observe.liveview import Cancel, Pause, Purge, Reload, Requeue, Resume


def job(kind: str = "render", pool: str = "bulk", **kw: Any) -> NewJob:
    return NewJob(kind=kind, pool=pool, payload=json.dumps({}), max_deliveries=3, **kw)


def dead(store: Any, *jobs: NewJob) -> list[int]:
    ids = store.enqueue_many(list(jobs))
    kinds = {j.kind for j in jobs}
    for c in store.claim(pool="bulk", kinds=kinds, n=len(jobs), node="node-a", lease=30.0):
        store.fail([Failure(c.lease, ErrorKind.MEMORY_LIMIT, "big", retry_delay=None)])
    return ids


def controls(store: Any) -> LiveControls:
    def unread() -> Any:
        raise AssertionError("the actions do not read the view")

    return LiveControls(store, unread)


def test_p_pauses_and_resumes_a_pool_and_says_how_to_undo(store: Any) -> None:
    live = controls(store)
    said = live.perform(Pause("bulk"))
    assert said == "paused pool bulk fleet-wide (running jobs finish) — p again to resume"
    assert [(p.pool, p.kind) for p in store.pauses()] == [("bulk", None)]
    assert live.perform(Pause("bulk")).startswith("pool bulk was paused already; nothing changed")
    said = live.perform(Resume("bulk"))
    assert said.startswith("resumed pool bulk (paused since ") and said.endswith("it again")
    assert store.pauses() == []
    assert live.perform(Resume("bulk")) == "pool bulk was not paused; nothing changed"


def test_p_on_a_pool_with_a_kind_paused_leaves_that_pause_alone_and_says_so(store: Any) -> None:
    """A kind paused from the command line (by someone, for a reason) is not lifted by the
    view's p: p lifts only the pool-wide pause p set, and both lines name the kind kept."""
    store.pause("bulk", "render")
    live = controls(store)
    said = live.perform(Pause("bulk"))
    assert said.endswith("— p again to resume all but kind render"), said
    said = live.perform(Resume("bulk"))
    assert said.startswith("resumed pool bulk (paused since ")
    assert "but kind render stays paused (fleetd resume bulk --kind render)" in said
    assert [(p.pool, p.kind) for p in store.pauses()] == [("bulk", "render")]
    store.pause("bulk", "thumb")  # every kind paused one by one: the view shows it paused
    said = live.perform(Resume("bulk"))
    assert said == (
        "pool bulk has no pool-wide pause to lift: kinds render, thumb are paused one by one "
        "and stay so (fleetd resume bulk lifts them)"
    )
    assert [(p.pool, p.kind) for p in store.pauses()] == [("bulk", "render"), ("bulk", "thumb")]


def test_c_cancels_a_running_job_and_says_who_stops_it(store: Any) -> None:
    running = store.enqueue(job())
    store.claim(pool="bulk", kinds={"render"}, n=1, node="node-a", lease=30.0)
    queued = store.enqueue(job())
    live = controls(store)
    assert live.perform(Cancel(running)) == (
        f"job {running}: cancel requested: node-a stops it within a second; it ends cancelled"
    )
    assert store.get(running).cancel_requested_at is not None
    said = live.perform(Cancel(queued))
    assert said == f"job {queued}: cancelled (it was queued; it will not run)"
    assert store.get(queued).state is JobState.CANCELLED
    assert live.perform(Cancel(queued)) == f"job {queued}: cancelled already; nothing changed"


def test_r_requeues_and_x_purges_one_dead_letter(store: Any) -> None:
    first, second = dead(store, job(), job())
    live = controls(store)
    said = live.perform(Requeue(first))
    assert said == f"requeued 1 job(s): {first} — queued again, with a fresh delivery budget"
    requeued = store.get(first)
    assert requeued.state is JobState.QUEUED and requeued.attempts == 0
    assert live.perform(Purge(second)) == f"purged 1 job(s): {second}"
    assert store.get(second) is None


def test_a_refusal_of_the_store_is_a_line_not_an_exception(store: Any) -> None:
    queued = store.enqueue(job())
    live = controls(store)
    said = live.perform(Requeue(queued))  # requeued twice by two operators: it is not dead
    assert said.startswith(f"could not requeue dead job {queued}: not dead")
    assert live.perform(Purge(10_000)).startswith("could not purge dead job 10000: no job")
    assert store.get(queued).state is JobState.QUEUED
    assert live.perform(Reload()) == ""


def test_the_dead_letters_of_a_pool_with_a_kind_or_tenant_filter(store: Any, clock: Any) -> None:
    ids = dead(
        store,
        job(kind="render", tenant="acme"),
        job(kind="render", tenant="zeta"),
        job(kind="parse", tenant="acme"),
        job(kind="parse", tenant="render"),  # a tenant named like a kind: matched once
    )
    clock.advance(90)
    live = controls(store)
    count, rows = live.dead_letters("bulk", "", 10, now=clock.now())
    assert count == 4 and [r.job for r in rows] == ids
    assert rows[0].error_kind == "memory_limit" and rows[0].last_error == "big"
    assert rows[0].died_ago is not None and 89 <= rows[0].died_ago <= 91
    count, rows = live.dead_letters("bulk", "render", 10, now=clock.now())
    assert count == 3 and [r.job for r in rows] == [ids[0], ids[1], ids[3]]
    count, rows = live.dead_letters("bulk", "acme", 1, now=clock.now())
    assert count == 2 and [r.job for r in rows] == [ids[0]]  # the first one fits
    assert live.dead_letters("other", "", 10, now=0.0) == (0, ())
