"""Measure how far a gradual memory bomb gets past ``memory_limit`` before fleetd stops it.

Runs a real ``fleetd start`` (one pool, one worker, max_deliveries 1, SQLite in a temporary
folder), enqueues ``--runs`` jobs of ``tests.support.handlers:gradual_bomb`` per profile one
after the other, and reads back each dead job's recorded peak RSS (the highest RSS the watchdog
saw: the RSS at the kill) and its last_error, which names the mechanism that stopped it::

    .venv/bin/python stress/measure_watchdog.py                  # 10 runs, both profiles
    .venv/bin/python stress/measure_watchdog.py --runs 20 --limit-mib 512

Profiles: "issue" is the bomb of the test suite (50 MiB touched every 50 ms toward 4 GiB);
"max-rate" touches 1 MiB chunks with no pause (as fast as the worker can: ~2 GiB/s here), the
worst case for a poll. Results are written up in docs/memory-limits.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from supervisor.client import Client  # noqa: E402
from supervisor.model import JobState  # noqa: E402

MIB = 1024 * 1024
PROFILES = {
    "issue": {"chunk_mib": 50, "interval": 0.05, "max_mib": 4096},
    "max-rate": {"chunk_mib": 1, "interval": 0.0, "max_mib": 4096},
}


def mechanism(error: str) -> str:
    if "watchdog" in error:
        return "watchdog"
    if "cgroup" in error:
        return "cgroup"
    if "allocation refused" in error:
        return "rlimit"
    return "other"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--limit-mib", type=int, default=256)
    args = parser.parse_args()
    limit = args.limit_mib * MIB

    folder = Path(tempfile.mkdtemp(prefix="fleetd-watchdog-"))
    config = folder / "fleet.toml"
    config.write_text(
        "[fleet]\n"
        f'database = "sqlite:///{folder / "q.db"}"\n'
        f'python_path = ["{REPO}"]\n'
        'grace_period = "1s"\n\n'
        "[pools.bomb]\n"
        'handlers = { gradual_bomb = "tests.support.handlers:gradual_bomb" }\n'
        "min_workers = 1\nmax_workers = 1\nmax_deliveries = 1\n"
        f'memory_limit = "{args.limit_mib}MiB"\ntimeout = "30s"\n'
    )
    with open(folder / "supervisor.log", "wb") as log:  # the child keeps its own copy
        sup = subprocess.Popen(
            [sys.executable, "-m", "supervisor", "start", "-c", str(config)],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    print(
        f"{platform.node()} {platform.system()} {platform.release()} {platform.machine()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"memory_limit {args.limit_mib} MiB, {args.runs} runs per profile, "
        f"{time.strftime('%Y-%m-%d')}"
    )
    print(
        f"{'profile':<9} {'stopped by':<16} {'peak RSS median':>16} {'max':>8} "
        f"{'overshoot median':>17} {'max':>8}"
    )
    try:
        with Client.from_config(config) as client:
            for name, payload in PROFILES.items():
                peaks, by = [], []
                for _ in range(args.runs):  # one at a time: each gets a fresh worker
                    job = client.wait(client.enqueue("gradual_bomb", payload), timeout=60)
                    if job.state != JobState.DEAD or job.peak_rss is None:
                        raise SystemExit(f"unexpected end: {job}")
                    peaks.append(job.peak_rss)
                    by.append(mechanism(job.last_error or ""))
                stopped = ", ".join(f"{m} {by.count(m)}" for m in sorted(set(by)))
                med, top = statistics.median(peaks), max(peaks)
                print(
                    f"{name:<9} {stopped:<16} {med / MIB:>12.0f} MiB {top / MIB:>4.0f} MiB "
                    f"{(med - limit) / MIB:>13.0f} MiB {(top - limit) / MIB:>4.0f} MiB"
                )
    finally:
        sup.send_signal(signal.SIGTERM)
        sup.wait(15)
    return 0


if __name__ == "__main__":
    sys.exit(main())
