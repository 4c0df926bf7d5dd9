"""``fleetd status --once`` in a real terminal (tmux) at 80×24 and 160×48, during a workload
with a memory bomb in flight: the frame must fit and say what matters.

With ``FLEETD_WRITE_STATUS_DOCS=1`` the captured frames are written to docs/status-80x24.txt
and docs/status-160x48.txt (the screenshots the docs show).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import uuid

import pytest

from tests.integration.fleet import REPO, Harness, handlers
from tests.support.wait import eventually

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")

POOLS = {
    "interactive": {"handlers": handlers("echo"), "bound": "io", "min_workers": 1},
    "bulk": {
        "handlers": handlers("sleep"),
        "bound": "io",
        "min_workers": 3,
        "max_workers": 3,
        "timeout": "30s",
        "latency_target": "20s",
    },
    "poison": {
        "handlers": handlers("balloon"),
        "bound": "io",
        "min_workers": 1,
        "max_workers": 1,
        "memory_limit": "256MiB",
        "timeout": "40s",
    },
}


def tmux_frame(command: str, width: int, height: int) -> str:
    """Run ``command`` in a detached tmux pane of that size and return the screen."""
    server, session = f"fleetd-test-{uuid.uuid4().hex[:8]}", "status"
    channel = f"done-{session}"
    tmux = ["tmux", "-L", server]
    script = f"{command}; tmux -L {server} wait-for -S {channel}; sleep 120"
    subprocess.run(
        [*tmux, "new-session", "-d", "-s", session, "-x", str(width), "-y", str(height), script],
        check=True,
        env={k: v for k, v in os.environ.items() if k not in ("TMUX", "COLUMNS", "LINES")},
    )
    try:
        subprocess.run([*tmux, "wait-for", channel], check=True, timeout=60)
        out = subprocess.run(
            [*tmux, "capture-pane", "-p", "-t", session], check=True, capture_output=True
        )
        return out.stdout.decode()
    finally:
        subprocess.run([*tmux, "kill-server"], check=False)


@pytest.mark.parametrize("engine", ["sqlite"])
def test_status_once_in_a_real_terminal_during_a_workload(fleet: Harness) -> None:
    config = fleet.configure(POOLS)
    sup = fleet.start()
    bomb = fleet.enqueue("balloon", {"mib": 184, "step_mib": 8, "interval": 0.05, "hold": 30})
    jobs = [fleet.enqueue("sleep", {"seconds": 20}) for _ in range(5)]
    jobs.append(fleet.enqueue("echo"))

    def bomb_in_flight() -> bool:
        sup.check_alive()
        workers = sup.workers(fleet.store, "poison")
        busy = [w for w in sup.workers(fleet.store, "bulk") if w["state"] == "busy"]
        return bool(workers and (workers[0]["rss"] or 0) > 180 * 2**20 and len(busy) == 3)

    eventually(bomb_in_flight, timeout=30)
    command = (
        f"cd {REPO} && env -u COLUMNS -u LINES {sys.executable} -m supervisor status "
        f"-c {config} --once"
    )
    frames = {size: tmux_frame(command, *size) for size in ((80, 24), (160, 48))}

    for (width, height), frame in frames.items():
        lines = frame.rstrip("\n").split("\n")
        assert len(lines) <= height and all(len(line) <= width for line in lines), frame
        assert lines[0].startswith("fleetd ") and "● healthy" in lines[0], frame
        for needle in (
            "interactive",
            "bulk",
            "poison",
            "want",
            "poison#1",
            "balloon",
            "/256M",
            "node-a",
            "running",
            "backlog 2",
        ):
            if needle == "backlog 2" and width >= 120:
                continue  # the wide table has a backlog column instead
            assert needle in frame, (needle, frame)
        rss_cell = next(line for line in lines if "poison#1" in line)
        shown_mib = int(re.search(r"(\d+)M/256M", rss_cell).group(1))
        assert shown_mib > 180, rss_cell  # the balloon's 184 MiB and the worker: near the limit
        assert sum("bulk#" in line for line in lines) == 3
    assert "host" in frames[(160, 48)] and "RSS p95/limit" in frames[(160, 48)]

    if os.environ.get("FLEETD_WRITE_STATUS_DOCS"):
        for (width, height), frame in frames.items():
            (REPO / "docs" / f"status-{width}x{height}.txt").write_text(frame.rstrip() + "\n")
    del bomb, jobs
