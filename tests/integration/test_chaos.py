"""The short chaos run on each engine: real supervisors, a hostile mix (memory bombs, hangs,
crashes, a fork bomb under RLIMIT_NPROC, flaky and SIGTERM-ignoring jobs), worker and
supervisor SIGKILLs, a drain and a join/leave on a seeded schedule; ``python -m stress chaos``
exits 0 only when every invariant held (stress/chaos_checks.py). Here its key figures are
asserted too, so a run that quietly did nothing cannot pass."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_short_chaos_run_holds_every_invariant(db_url: str) -> None:
    # not tmp_path: the poison pool runs as an unprivileged user, who must reach the
    # execution log, and pytest's base folder is private to root
    folder = Path(tempfile.mkdtemp(prefix="fleetd-chaos-test-"))
    folder.chmod(0o755)
    run = folder / "run"
    summary = folder / "summary.json"
    command = [sys.executable, "-m", "stress", "chaos", "--short", "--seed", "7"]
    command += ["--database", db_url, "--folder", str(run), "--json", str(summary)]
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
