"""Fixtures for tests with real supervisors: ``start_supervisor`` (launch and tear down by pid,
no descendant left behind) and ``fleet`` (a ``Harness`` on the test's database)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import psutil
import pytest

from supervisor.store import Store, open_store
from tests.integration.fleet import Harness, Supervisor


@pytest.fixture
def start_supervisor(tmp_path: Path) -> Iterator[Callable[..., Supervisor]]:
    """Start ``fleetd start`` subprocesses; at teardown stop each (SIGTERM, wait, SIGKILL),
    print its log (pytest shows it when the test failed) and assert that no process it ever
    forked is still alive."""
    started: list[Supervisor] = []

    def start(config: Path, node_id: str = "node-a", hooks: Sequence[str] = ()) -> Supervisor:
        sup = Supervisor(config, node_id, tmp_path, run=len(started) + 1, hooks=hooks).start()
        started.append(sup)
        return sup

    yield start

    leftovers: list[str] = []
    for sup in started:
        left = sup.stop()
        assert sup.proc is not None
        print(f"----- supervisor {sup.node_id} pid {sup.pid} exit {sup.proc.returncode} -----")
        print(sup.log())
        for proc in left:
            leftovers.append(f"pid {proc.pid} of {sup.node_id}")
            with contextlib.suppress(psutil.Error):
                proc.kill()
    assert not leftovers, f"processes outlived their supervisor: {leftovers}"


@pytest.fixture
def live_store(db_url: str) -> Iterator[Store]:
    """The test's view of the queue, on the real clock (the supervisor uses it too)."""
    store = open_store(db_url)
    yield store
    store.close()


@pytest.fixture
def fleet(
    tmp_path: Path,
    db_url: str,
    live_store: Store,
    start_supervisor: Callable[..., Supervisor],
) -> Harness:
    return Harness(tmp_path, db_url, live_store, start_supervisor)
