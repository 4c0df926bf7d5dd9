"""`fleetd start` itself: a handler that cannot be imported stops it before any fork, a pool
whose workers die at boot backs off instead of fork-looping, and a job enqueued on an idle
fleet is picked up at once (the wake-up), not at the next slow poll."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import pytest

from supervisor.model import JobState
from tests.integration.fleet import Harness, handlers, write_config
from tests.support.wait import eventually

pytestmark = pytest.mark.slow
SQLITE_ONLY = pytest.mark.parametrize("engine", ["sqlite"])  # the store plays no part here


@SQLITE_ONLY
@pytest.mark.parametrize(
    ("spec", "cause"),
    [
        ("tests.support.no_such_module:run", "module 'tests.support.no_such_module' not found"),
        ("tests.support.handlers:no_such_function", "has no attribute 'no_such_function'"),
    ],
)
def test_an_unimportable_handler_exits_2_naming_it_and_forks_nothing(
    tmp_path: Path, db_url: str, start_supervisor, spec: str, cause: str
) -> None:
    pools = {
        "good": {"handlers": handlers("echo"), "min_workers": 2},
        "broken": {"handlers": {"render": spec}, "min_workers": 1},
    }
    sup = start_supervisor(write_config(tmp_path, db_url, pools), "node-a")
    assert sup.wait_exit(timeout=20) == 2
    lines = [line for line in sup.log().splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert spec in lines[0] and cause in lines[0] and "render" in lines[0]
    assert lines[0].startswith("fleetd: error: ")
    assert sup.forks() == 0
    assert not sup.seen
    assert not (tmp_path / "fleetd.db").exists()  # stopped before the store was even opened


@SQLITE_ONLY
def test_a_pool_whose_workers_die_at_boot_backs_off_and_the_others_carry_on(
    fleet: Harness,
) -> None:
    fleet.configure(
        {
            "broken": {
                "handlers": handlers("noop"),
                "min_workers": 1,
                "user": "nonexistent-user-xyz",
            },
            "healthy": {"handlers": handlers("echo"), "min_workers": 1},
        }
    )
    sup = fleet.start()
    window_start = time.monotonic()
    job = fleet.enqueue("echo", {"n": 1})
    (done,) = fleet.wait_final([job], watch=[sup])
    assert done.state == JobState.DONE and done.result["n"] == 1
    # The measurement window: how many forks in ~3 s. Waiting is the point here.
    time.sleep(max(0.0, 3.0 - (time.monotonic() - window_start)))
    sup.check_alive()
    forks = sup.forks()
    broken_forks = forks - 1  # the healthy pool forked its one worker once
    # respawn_delay: 0.5 s, 1 s, 2 s ... so forks at ~0, 0.5, 1.5 (and 3.5) s; a fork loop
    # would have made hundreds.
    assert 2 <= broken_forks <= 5, sup.log()
    log = sup.log()
    assert "cannot switch to user='nonexistent-user-xyz'" in log
    assert "died before it was ready" in log and "next fork in" in log


def test_a_job_enqueued_on_an_idle_fleet_is_picked_up_at_once(fleet: Harness) -> None:
    fleet.configure({"quick": {"handlers": handlers("echo"), "min_workers": 1}})
    sup = fleet.start()
    sup.wait_workers(fleet.store, "quick", 1, "idle")
    latencies = []
    for n in range(3):
        # Let the fleet go idle long enough for its adaptive poll to back off to 1 s
        # (0.05 s doubling: 1.55 s), so only a wake-up can make the pickup quick.
        time.sleep(1.6)
        job = fleet.enqueue("echo", {"n": n})
        (done,) = fleet.wait_final([job], timeout=10, watch=[sup])
        assert done.state == JobState.DONE
        assert done.started_at is not None
        latencies.append(done.started_at - done.enqueued_at)
    # Without the wake-up a 1 s poll gives pickups spread over 0..1 s (median ~0.5 s).
    assert max(latencies) < 1.0, latencies
    assert statistics.median(latencies) < 0.3, latencies


def test_done_jobs_are_pruned_after_the_retention(fleet: Harness) -> None:
    fleet.configure({"p": {"handlers": handlers("echo"), "min_workers": 1}}, retention="1s")
    sup = fleet.start()
    old = fleet.enqueue("echo", {"n": 1})
    fleet.wait_final([old], watch=[sup])
    sup.stop()  # the next supervisor prunes at its start, the retention having passed
    time.sleep(1.1)  # deliberately: let the done job age past the 1 s retention
    sup2 = fleet.start("node-b")
    eventually(lambda: fleet.store.get(old) is None, timeout=10)
    sup2.check_alive()


@SQLITE_ONLY
def test_the_process_title_names_the_config_file(fleet: Harness) -> None:
    """Two fleets on one host tell apart in ``ps``: the title names the config as the command
    line gave it, with the pools and the workers."""
    config = fleet.configure({"p": {"handlers": handlers("echo"), "min_workers": 2}})
    sup = fleet.start()
    sup.wait_workers(fleet.store, "p", 2)
    expected = f"fleetd: supervisor [fleet] {config} 1 pools 2 workers"
    seen: list[str] = []

    def titled() -> bool:
        assert sup.ps is not None
        seen.append(" ".join(sup.ps.cmdline()).strip())  # setproctitle pads with empty args
        return seen[-1] == expected

    assert eventually(titled, timeout=10), seen[-1:]
