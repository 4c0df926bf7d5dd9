"""The whole process tree of a job contained without a memory cgroup (``memory_cgroup =
false``), on both engines: the worker is a subreaper, so a daemon a job leaves (double fork,
setsid) is gone within a second of the job's end, whether the job was a Python handler or a
command, and also when the job's worker was killed at its timeout (the supervisor is a
subreaper too); a job whose memory is spread over several processes, each below the limit,
together above it, is stopped as ``memory_limit`` by the watchdog, which counts the tree."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import psutil
import pytest

from supervisor.model import ErrorKind, JobState
from tests.integration.fleet import Harness, alive
from tests.support.tree_handlers import DAEMON
from tests.support.wait import eventually

TREE = "tests.support.tree_handlers:"


def gone(pid: int) -> bool:
    try:
        return not alive(psutil.Process(pid))
    except psutil.NoSuchProcess:
        return True


@pytest.mark.alone  # the bomb must reach its limit before its timeout: no neighbour's load
def test_nothing_a_job_starts_outlives_it(fleet: Harness, tmp_path: Path) -> None:
    fleet.configure(
        {
            "tree": {
                "handlers": {
                    "py_daemon": TREE + "leave_daemon",
                    "cmd_daemon": {"command": [sys.executable, "-c", DAEMON, "{pidfile}"]},
                    "tree_bomb": TREE + "tree_bomb",
                },
                "bound": "io",
                "min_workers": 3,
                "max_workers": 3,
                "memory_limit": "256MiB",
                "timeout": "2s",
                "max_deliveries": 1,
                "pipeline": 1,
            }
        },
        memory_cgroup=False,
    )
    sup = fleet.start()
    sup.wait_workers(fleet.store, "tree", 3)
    files = {name: str(tmp_path / f"{name}.pid") for name in ("py", "cmd", "hung")}
    py = fleet.enqueue("py_daemon", {"pidfile": files["py"]})
    cmd = fleet.enqueue("cmd_daemon", {"pidfile": files["cmd"]})
    # its worker is SIGKILLed at the timeout: the daemon escaped its process group (setsid)
    hung = fleet.enqueue("py_daemon", {"pidfile": files["hung"], "hang": 60})
    # 4 x 100 MiB, one after the other: each far below 256 MiB, together above
    bomb = fleet.enqueue("tree_bomb", {"children": 4, "mib": 100, "hold": 20})
    jobs = fleet.wait_final([py, cmd, hung, bomb], timeout=30, watch=[sup])
    py_job, cmd_job, hung_job, bomb_job = jobs

    assert py_job.state == JobState.DONE and cmd_job.state == JobState.DONE, jobs
    daemons = [py_job.result, int(cmd_job.result["json"]), int(Path(files["hung"]).read_text())]
    # within a second of the job's end (in fact before its result was sent)
    eventually(lambda: all(gone(pid) for pid in daemons), timeout=1.0, interval=0.01)

    assert hung_job.error_kind == ErrorKind.TIMEOUT, hung_job

    assert bomb_job.error_kind == ErrorKind.MEMORY_LIMIT, bomb_job
    assert "process(es) of its job" in bomb_job.last_error, bomb_job.last_error
    assert "stopped by the watchdog" in bomb_job.last_error
    assert not any(p.name() == "python3" for p in sup.alive_descendants() if alive(p))


@pytest.mark.skipif(os.geteuid() != 0, reason="a private /dev/shm needs root (CAP_SYS_ADMIN)")
def test_what_a_job_leaves_in_dev_shm_does_not_outlive_it(fleet: Harness) -> None:
    fleet.configure(
        {
            "shm": {
                "handlers": {"shm_files": TREE + "shm_files", "shm_fill": TREE + "shm_fill"},
                "memory_limit": "128MiB",
                "min_workers": 1,
                "max_workers": 1,
                "max_deliveries": 1,
                "pipeline": 1,
            }
        },
        memory_cgroup=False,
    )
    sup = fleet.start()
    name = f"fleetd-test-{uuid.uuid4().hex}"
    first = fleet.enqueue("shm_files", {"write": name})
    second = fleet.enqueue("shm_files")
    # 450 MiB into a /dev/shm of memory_limit + 128 MiB: refused there, and so memory_limit
    bomb = fleet.enqueue("shm_fill", {"mib": 450})
    a, b, c = fleet.wait_final([first, second, bomb], watch=[sup])
    assert c.error_kind == ErrorKind.MEMORY_LIMIT, c
    assert "filled its private /dev/shm" in c.last_error, c.last_error
    assert a.state == b.state == JobState.DONE, (a, b)
    assert a.result["pid"] == b.result["pid"]  # one worker ran both
    assert a.result["files"] == b.result["files"] == []  # its own, emptied after each job
    assert not os.path.exists(f"/dev/shm/{name}")  # never in the host's /dev/shm


def test_python_helpers_kept_across_jobs_live_unless_end_job_tree(fleet: Harness) -> None:
    def pool(end_job_tree: bool | None) -> dict:
        keys = {} if end_job_tree is None else {"end_job_tree": end_job_tree}
        return {"min_workers": 1, "max_workers": 1, "pipeline": 1, "max_deliveries": 1, **keys}

    fleet.configure(
        {
            "kept": {"handlers": {"kept": TREE + "keep_helper"}, **pool(None)},
            "ended": {
                "handlers": {"ended": TREE + "keep_helper", "tracker": TREE + "resource_tracker"},
                **pool(True),
            },
        },
        memory_cgroup=False,
    )
    sup = fleet.start()
    kinds = ("kept", "ended", "tracker", "kept", "ended", "tracker")
    ids = [fleet.enqueue(kind) for kind in kinds]
    kept1, ended1, tracker1, kept2, ended2, tracker2 = fleet.wait_final(
        ids, timeout=30, watch=[sup]
    )
    # Python handlers only: the default keeps what a handler keeps on purpose
    assert kept1.result == {"pid": kept1.result["pid"], "restarted": False}, kept1
    assert kept2.result == {"pid": kept1.result["pid"], "restarted": False}, kept2
    # end_job_tree = true: killed after every job, so started again
    assert ended1.result["restarted"] is False and ended2.result["restarted"] is True, ended2
    # ... but multiprocessing's resource tracker is spared: one for every job of the worker
    assert tracker1.state == tracker2.state == JobState.DONE, (tracker1, tracker2)
    assert tracker1.result == tracker2.result and not gone(tracker1.result)
