"""Test handlers whose memory lives in *subprocesses* of the job, where the parent's RSS
watchdog (it reads the worker's RSS only) cannot see it and RLIMIT_DATA (per process) does not
add it up. Only a cgroup around the worker's whole process tree can stop them."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from tests.support.handlers import recorded

# A child that touches ``argv[1]`` MiB (b"x" * n is a memset: every page resident), says so on
# stdout, and holds it for ``argv[2]`` seconds. -I: no site or PYTHON* variables, just python.
HOLD = (
    "import sys, time\n"
    "block = b'x' * (int(sys.argv[1]) << 20)\n"
    "print(len(block) >> 20, flush=True)\n"
    "time.sleep(float(sys.argv[2]))\n"
)


@recorded
def tree_bomb(payload: dict[str, Any]) -> list[int]:
    """Start ``children`` subprocesses (default 4) that each hold ``mib`` MiB (default 150)
    for ``hold`` seconds (default 15), one after the other, then wait for all of them. Raises
    RuntimeError when one of them did not exit 0 (the kernel killed it, for instance)."""
    n = int(payload.get("children", 4))
    mib = int(payload.get("mib", 150))
    hold = float(payload.get("hold", 15.0))
    procs = []
    for _ in range(n):
        proc = subprocess.Popen(
            [sys.executable, "-I", "-c", HOLD, str(mib), str(hold)],
            stdout=subprocess.PIPE,
        )
        procs.append(proc)
        assert proc.stdout is not None
        proc.stdout.readline()  # "150" once it holds its memory, "" if it died first
    codes = [proc.wait() for proc in procs]
    if any(codes):
        raise RuntimeError(f"a child process failed: exit statuses {codes}")
    return codes


def shm_bomb(payload: dict[str, Any]) -> int:
    """After ``delay`` seconds, write ``mib`` MiB (default 450) to a file in /dev/shm and hold
    it ``hold`` seconds.
    tmpfs pages count against the worker's memory cgroup, but not against its RSS (they are
    not mapped) nor its RLIMIT_DATA: only the cgroup stops it. The file is unlinked at once, so
    the pages go when the process does. Records its start first (a kill leaves no end)."""
    import os
    import time

    from tests.support.handlers import record

    record(payload, time.time(), None, "started")
    time.sleep(float(payload.get("delay", 0.0)))
    mib = int(payload.get("mib", 450))
    fd = os.open("/dev/shm", os.O_TMPFILE | os.O_RDWR, 0o600)
    try:
        block = b"x" * (1 << 20)
        for _ in range(mib):
            os.write(fd, block)
        time.sleep(float(payload.get("hold", 10.0)))
    finally:
        os.close(fd)
    return mib


# A process that leaves a daemon behind: double fork, setsid, the daemon writes its pid to
# argv[1] (atomically) and sleeps; the first process waits for the file, prints the pid, exits.
DAEMON = (
    "import os, sys, time\n"
    "path = sys.argv[1]\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    "        open(path + '.tmp', 'w').write(str(os.getpid()))\n"
    "        os.rename(path + '.tmp', path)\n"
    "        time.sleep(1000)\n"
    "    os._exit(0)\n"
    "os.wait()\n"
    "while not os.path.exists(path):\n"
    "    time.sleep(0.005)\n"
    "print(open(path).read(), flush=True)\n"
)


def leave_daemon(payload: dict[str, Any]) -> int:
    """Start a daemon (double fork, setsid) from the worker itself, as a library might, and
    return its pid once it runs. ``hang``: then sleep that long (past the job's timeout)."""
    import os
    import time

    path = payload["pidfile"]
    if os.fork() == 0:
        try:
            os.setsid()
            if os.fork() == 0:
                with open(path + ".tmp", "w") as f:
                    f.write(str(os.getpid()))
                os.rename(path + ".tmp", path)
                time.sleep(1000)
        finally:
            os._exit(0)
    os.wait()
    while not os.path.exists(path):
        time.sleep(0.005)
    time.sleep(float(payload.get("hang", 0)))
    with open(path) as f:
        return int(f.read())


def shm_files(payload: dict[str, Any]) -> dict[str, Any]:
    """List /dev/shm, then write ``payload["write"]`` there (if given) and leave it; the
    worker's pid and the listing."""
    import os

    found = sorted(os.listdir("/dev/shm"))
    if payload.get("write"):
        with open(os.path.join("/dev/shm", payload["write"]), "w") as f:
            f.write("left behind")
    return {"pid": os.getpid(), "files": found}


def shm_fill(payload: dict[str, Any]) -> int:
    """Write ``mib`` MiB (default 450) to a named file in /dev/shm and leave it there."""
    import os

    with open(f"/dev/shm/fleetd-fill-{os.getpid()}", "wb") as f:
        block = b"x" * (1 << 20)
        for _ in range(int(payload.get("mib", 450))):
            f.write(block)
    return int(payload.get("mib", 450))


_HELPER: subprocess.Popen[bytes] | None = None


def keep_helper(payload: dict[str, Any]) -> dict[str, Any]:
    """A helper process kept across jobs (as a reused process pool is): started by the first
    job of the worker, reused by the next. Its pid, and whether it had to be started again
    because the one from an earlier job is gone."""
    global _HELPER
    restarted = _HELPER is not None and _HELPER.poll() is not None
    if _HELPER is None or restarted:
        _HELPER = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    return {"pid": _HELPER.pid, "restarted": restarted}


def resource_tracker(payload: dict[str, Any]) -> int:
    """Start multiprocessing's resource tracker (once per worker) and return its pid."""
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    return resource_tracker._resource_tracker._pid
