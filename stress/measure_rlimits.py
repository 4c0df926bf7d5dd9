"""Measure how RLIMIT_AS and RLIMIT_DATA behave in a forked child on this machine.

Plain Python, stdlib only, so it can be re-run anywhere (and under another interpreter, for
example a scratch venv that has numpy)::

    python stress/measure_rlimits.py                        # 256 MiB, both resources
    python stress/measure_rlimits.py --limit-mib 256 --preload sqlalchemy,psutil,rich,click
    /tmp/npvenv/bin/python stress/measure_rlimits.py --numpy

Every case runs in a fresh ``os.fork()`` child that sets the limit (soft and hard) and then does
one hostile or ordinary thing. The child reports a JSON line over a pipe; the parent prints one
table row per case with the outcome, the time it took and the child's memory figures
(from /proc/self/status) at the end. A child that hangs is killed after ``--case-timeout``.

The results and the default fleetd picks from them are written up in docs/memory-limits.md and
in the docstring of workers/limits.py.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import resource
import select
import signal
import sys
import threading
import time
from collections.abc import Callable

MIB = 1024 * 1024
GIB = 1024 * MIB
RESOURCES = {"AS": resource.RLIMIT_AS, "DATA": resource.RLIMIT_DATA}


def status() -> dict[str, int]:
    """VmSize, VmData, VmRSS, VmHWM and Threads of this process, in MiB (Threads: a count)."""
    out: dict[str, int] = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmSize", "VmData", "VmRSS", "VmHWM"):
                out[key] = int(rest.split()[0]) // 1024
            elif key == "Threads":
                out[key] = int(rest)
    return out


# --- the cases: each runs in the child after the limit is set and returns a short outcome ---


def case_instant(_limit: int) -> str:
    """bytearray(8 GiB): must fail at once, and the child must still allocate afterwards."""
    try:
        bytearray(8 * GIB)
    except MemoryError:
        survived = len(bytearray(MIB)) == MIB
        return "MemoryError" + ("; survives" if survived else "; broken after")
    return "ALLOCATED 8 GiB"


def case_gradual(_limit: int) -> str:
    """50 MiB touched chunks towards 4 GiB, like the gradual bomb; report where it stops."""
    chunks = []
    try:
        while len(chunks) * 50 < 4096:
            chunks.append(b"x" * (50 * MIB))  # b"x" * n memsets: every page is touched
    except MemoryError:
        got = len(chunks) * 50
        chunks.clear()
        survived = len(bytearray(MIB)) == MIB
        return f"MemoryError after {got} MiB" + ("; survives" if survived else "")
    return "ALLOCATED 4 GiB"


def case_threads(_limit: int) -> str:
    """Start up to 64 threads that each malloc (so glibc gives each its own arena) and park."""
    stop = threading.Event()

    def body() -> None:
        bytearray(4096)  # > 512 bytes: goes to malloc, which assigns this thread an arena
        stop.wait()

    started = 0
    err = ""
    try:
        for _ in range(64):
            t = threading.Thread(target=body, daemon=True)
            t.start()
            started += 1
    except (RuntimeError, MemoryError) as exc:
        err = f"; then {type(exc).__name__}: {exc}"
    return f"{started} threads started{err}"


def case_mmap_private(_limit: int) -> str:
    """A 1 GiB private anonymous mmap (what malloc does above the mmap threshold)."""
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    try:
        m = mmap.mmap(-1, GIB, flags=flags)
    except OSError as exc:
        return f"OSError errno {exc.errno} ({os.strerror(exc.errno or 0)})"
    m.close()
    return "MAPPED 1 GiB"


def case_mmap_shared(limit: int) -> str:
    """A shared anonymous mmap (Python's mmap.mmap(-1, n) default), touched past the limit."""
    size = limit + 128 * MIB
    try:
        m = mmap.mmap(-1, size)
    except OSError as exc:
        return f"OSError errno {exc.errno} ({os.strerror(exc.errno or 0)})"
    for off in range(0, size, 4096):
        m[off] = 1
    rss = status()["VmRSS"]
    m.close()
    return f"MAPPED and touched {size // MIB} MiB (RSS {rss} MiB)"


def case_numpy(_limit: int) -> str:
    """import numpy and run a small matrix product (OpenBLAS starts its threads then)."""
    try:
        import numpy  # the import under the limit is the measurement

        a = numpy.ones((200, 200))
        float((a @ a).sum())
    except BaseException as exc:
        return f"{type(exc).__name__}: {str(exc)[:60]}"
    return "ok"


CASES: dict[str, Callable[[int], str]] = {
    "instant bytearray(8 GiB)": case_instant,
    "gradual 50 MiB chunks": case_gradual,
    "threads (<=64)": case_threads,
    "mmap private 1 GiB": case_mmap_private,
    "mmap shared, touched": case_mmap_shared,
    "import numpy + matmul": case_numpy,
}


# --- running one case in a forked child ---


def child(wfd: int, res_name: str | None, limit: int, case: Callable[[int], str]) -> None:
    """Set the limit, run the case, report one JSON line, and _exit (never return into main)."""
    code = 0
    try:
        before = status()
        if res_name is not None:
            resource.setrlimit(RESOURCES[res_name], (limit, limit))
        t0 = time.perf_counter()
        outcome = case(limit)
        ms = (time.perf_counter() - t0) * 1000
        report = {"outcome": outcome, "ms": ms, "before": before, "after": status()}
        os.write(wfd, json.dumps(report).encode() + b"\n")
    except BaseException as exc:
        os.write(wfd, json.dumps({"outcome": f"{type(exc).__name__}: {exc}"}).encode() + b"\n")
        code = 1
    finally:
        os._exit(code)


def run_case(res_name: str | None, limit: int, case: Callable[[int], str], timeout: float) -> dict:
    """Fork, run ``case`` under ``res_name``=``limit`` in the child, return its report."""
    rfd, wfd = os.pipe()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        child(wfd, res_name, limit, case)
    os.close(wfd)
    data, hung = read_until(rfd, time.monotonic() + timeout)
    os.close(rfd)
    if hung:
        os.kill(pid, signal.SIGKILL)
    _, wstatus = os.waitpid(pid, 0)
    report = json.loads(data) if data else {"outcome": "no report"}
    if hung:
        report["outcome"] = f"HANG (killed after {timeout:.0f}s)"
    elif os.WIFSIGNALED(wstatus):
        report["outcome"] += f" [killed by {signal.Signals(os.WTERMSIG(wstatus)).name}]"
    elif not data:
        report["outcome"] += f" [exit {os.WEXITSTATUS(wstatus)}]"
    return report


def read_until(fd: int, deadline: float) -> tuple[bytes, bool]:
    """Read one line from ``fd``: (line, False), (b"", False) on EOF, (b"", True) on timeout."""
    buf = b""
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return b"", True
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"", False
        buf += chunk
    return buf, False


def row(res_name: str, limit_mib: int, case_name: str, report: dict) -> str:
    """One table row: resource, limit, case, outcome, ms, VmSize/VmData/RSS before and after."""
    before, after = report.get("before", {}), report.get("after", {})

    def fig(d: dict, key: str) -> str:
        return str(d.get(key, "-"))

    figs = f"{fig(before, 'VmSize')}/{fig(before, 'VmData')}/{fig(before, 'VmRSS')}"
    figs += f" -> {fig(after, 'VmSize')}/{fig(after, 'VmData')}/{fig(after, 'VmRSS')}"
    ms = f"{report['ms']:.1f}" if "ms" in report else "-"
    return f"| {res_name} | {limit_mib} | {case_name} | {report['outcome']} | {ms} | {figs} |"


# --- the threshold search for numpy ---


def numpy_threshold(res_name: str, lo_mib: int, hi_mib: int, timeout: float) -> int:
    """Smallest limit (MiB, 2 MiB steps) at which import numpy + matmul succeeds once."""
    while hi_mib - lo_mib > 2:
        mid = (lo_mib + hi_mib) // 2
        ok = run_case(res_name, mid * MIB, case_numpy, timeout)["outcome"] == "ok"
        lo_mib, hi_mib = (lo_mib, mid) if ok else (mid, hi_mib)
    return hi_mib


def numpy_near_threshold(res_name: str, timeout: float, trials: int) -> None:
    """Print the threshold and what happens in repeated trials just below and above it."""
    base = status()
    threshold = numpy_threshold(res_name, 8, 1024, timeout)
    print(
        f"\nRLIMIT_{res_name}: import numpy + matmul first succeeds at {threshold} MiB "
        f"(this interpreter's VmSize {base['VmSize']} MiB, VmData {base['VmData']} MiB)"
    )
    for delta in (-8, -4, -2, 0, 4, 8):
        limit = threshold + delta
        seen: dict[str, int] = {}
        for _ in range(trials):
            outcome = run_case(res_name, limit * MIB, case_numpy, timeout)["outcome"]
            seen[outcome] = seen.get(outcome, 0) + 1
        print(f"  {limit:5d} MiB: " + "; ".join(f"{n}x {o}" for o, n in seen.items()))


def main() -> None:
    """Parse arguments, run every case under each resource and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit-mib", type=int, default=256)
    ap.add_argument("--preload", default="", help="comma-separated modules to import first")
    ap.add_argument("--numpy", action="store_true", help="also search numpy's threshold")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--case-timeout", type=float, default=20.0)
    args = ap.parse_args()
    for name in filter(None, args.preload.split(",")):
        __import__(name)
    limit = args.limit_mib * MIB
    base = status()
    with open("/proc/sys/vm/overcommit_memory") as f:
        overcommit = f.read().strip()
    print(
        f"python {sys.version.split()[0]}, kernel {os.uname().release}, "
        f"overcommit_memory {overcommit}, "
        f"preloaded [{args.preload}], parent VmSize {base['VmSize']} MiB, "
        f"VmData {base['VmData']} MiB, RSS {base['VmRSS']} MiB\n"
    )
    print("| limit | MiB | case | outcome | ms | VmSize/VmData/RSS MiB before -> after |")
    print("|---|---|---|---|---|---|")
    for res_name in RESOURCES:
        for case_name, case in CASES.items():
            if case is case_numpy and not args.numpy:
                continue
            report = run_case(res_name, limit, case, args.case_timeout)
            print(row(res_name, args.limit_mib, case_name, report), flush=True)
    if args.numpy:
        for res_name in RESOURCES:
            numpy_near_threshold(res_name, args.case_timeout, args.trials)


if __name__ == "__main__":
    main()
