"""Driver errors reach callers as the store's own errors, whatever path the statement took
(the ack's executemany goes to the driver's cursor directly)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import event

from supervisor.errors import StoreUnavailable
from supervisor.model import Ack, NewJob
from supervisor.store import open_store


def test_a_full_disk_during_an_ack_is_store_unavailable(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/q.db")
    store.enqueue_many([NewJob("k", "p", "{}", 3) for _ in range(4)])
    claimed = store.claim(pool="p", kinds=["k"], n=4, node="n", lease=60.0)

    def full(dbapi_conn, _record) -> None:  # the file may not grow: "database or disk is full"
        pages = dbapi_conn.execute("PRAGMA page_count").fetchone()[0]
        dbapi_conn.execute(f"PRAGMA max_page_count = {pages}")

    store.engine.dispose()
    event.listen(store.engine, "connect", full)
    big = '"' + "x" * 500_000 + '"'
    with pytest.raises(StoreUnavailable, match="full"):
        store.ack([Ack(c.lease, big) for c in claimed])
    for c in claimed:  # nothing was written
        job = store.get(c.job_id)
        assert job is not None and job.state.value == "leased"
