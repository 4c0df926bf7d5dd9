"""The short chaos run on each engine: real supervisors, a hostile mix (memory bombs, hangs,
crashes, a fork bomb under RLIMIT_NPROC, flaky and SIGTERM-ignoring jobs), worker and
supervisor SIGKILLs, a drain and a join/leave on a seeded schedule; ``python -m stress chaos``
exits 0 only when every invariant held (stress/chaos_checks.py). Here its key figures are
asserted too, so a run that quietly did nothing cannot pass.

On PostgreSQL the run is also made with real restarts of the database server
(``--allow-db-restart``), but only where ``FLEETD_TEST_ALLOW_DB_RESTART=1`` says the server is
the suite's alone: a restart (a fast shutdown) ends every client's sessions, so on a machine
where others run their tests against the same server it fails theirs.
tests/unit/test_stress_chaos_db.py covers the flag and the schedule without a server."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from stress import chaos_db
from tests.support.databases import postgres_schema_url

ALLOW_RESTART = "FLEETD_TEST_ALLOW_DB_RESTART"

pytestmark = pytest.mark.slow
# a hostile mix whose kills and drains are judged against the clock: no neighbour's load
alone = pytest.mark.alone

ROOT = Path(__file__).resolve().parents[2]


def run_chaos(database: str, *options: str) -> dict[str, Any]:
    """Run ``python -m stress chaos --short`` on ``database``, assert that every invariant
    held and that the run did what it was asked to, and return its figures (the run's folder
    is kept when an assertion fails; a failed run names it)."""
    # not tmp_path: the poison pool runs as an unprivileged user, who must reach the
    # execution log, and pytest's base folder is private to root
    folder = Path(tempfile.mkdtemp(prefix="fleetd-chaos-test-"))
    folder.chmod(0o755)
    summary = folder / "summary.json"
    command = [sys.executable, "-m", "stress", "chaos", "--short", "--seed", "7", *options]
    command += ["--database", database, "--folder", str(folder / "run"), "--json", str(summary)]
    proc = subprocess.run(
        command,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
        env={**os.environ, "COLUMNS": "160"},
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"chaos failed (folder {folder}):\n{output}"
    report = json.loads(summary.read_text())
    figures = report["figures"]
    assert report["violations"] == []

    enqueued = figures["jobs.enqueued"]
    assert enqueued == 300 and figures["jobs.in the store"] == enqueued
    assert figures["jobs.lost"] == 0
    assert figures["jobs.done"] + figures["jobs.dead"] == enqueued
    assert figures["poison.dead"] == figures["poison.enqueued"] >= 7  # every poison kind
    assert figures["jobs.dead"] == figures["poison.dead"]
    assert figures["normal.dead"] == 0
    assert figures["normal.done"] == figures["normal.enqueued"]
    assert figures["faults.worker kills (SIGKILL)"] >= 2
    assert figures["faults.supervisor kills (SIGKILL, restarted)"] >= 1
    assert figures["faults.drains (SIGTERM, restarted: rolling deploy)"] >= 1
    assert figures["faults.joins and leaves (SIGTERM)"] >= 1
    assert figures["drains.jobs left leased by a drained supervisor"] == 0
    assert figures["drains.leases that expired under a drained supervisor"] == 0
    assert figures["processes.left behind at the end"] == 0
    assert figures["caps.call: most executions at once"] <= figures["caps.call: max_inflight"]
    assert figures["jobs.torn log lines"] == 0
    assert figures["jobs.executions logged"] >= enqueued
    shutil.rmtree(folder, ignore_errors=True)
    return figures


@alone
@pytest.mark.timeout(300)
def test_short_chaos_run_holds_every_invariant(db_url: str) -> None:
    figures = run_chaos(db_url)
    assert figures["faults.database server restarts"] == 0


@pytest.mark.postgres
@pytest.mark.skipif(
    os.environ.get(ALLOW_RESTART) != "1",
    reason=f"restarts the PostgreSQL server, cutting every other client's connections: set "
    f"{ALLOW_RESTART}=1 where the server is this suite's alone",
)
@alone  # and the restart cuts every other test's connections
@pytest.mark.timeout(300)
def test_short_chaos_run_with_database_restarts_holds_every_invariant() -> None:
    """Two restarts of the real server while the supervisors work. Every other connection
    to the server is cut too, so the test leaves it accepting connections whatever happens."""
    with postgres_schema_url() as url:
        try:
            cluster = chaos_db.cluster_for(url)
        except chaos_db.NotRestartable as exc:
            pytest.skip(f"the harness cannot restart this server: {exc}")
        try:
            figures = run_chaos(url, "--allow-db-restart", "--db-restarts", "2")
        finally:
            assert chaos_db.ensure_running(cluster), "the PostgreSQL server stayed down"
    assert figures["faults.database server restarts"] == 2
    assert figures["database.restart command until accepting, max / mean"] != "-"


def test_database_restarts_are_refused_on_sqlite() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "stress", "chaos", "--short", "--allow-db-restart"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.startswith("chaos: --allow-db-restart: needs PostgreSQL")
    assert proc.stderr.count("\n") == 1
