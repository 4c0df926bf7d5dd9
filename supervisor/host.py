"""Facts about the host this process runs on: its cores, its memory, and which cgroup memory
mechanism its workers can be put under. Linux; elsewhere every fact degrades to a safe answer.

``memory_cgroup()`` says which of three mechanisms the supervisor can use for per-worker memory
cgroups, with a one-line reason:

- ``"v2"``: the unified hierarchy. Our cgroup lists ``memory`` in ``cgroup.controllers`` and
  children can get it: it is in our ``cgroup.subtree_control`` already, or writing ``+memory``
  there succeeds. cgroup v2's "no internal processes" rule makes that write fail (EBUSY) in any
  non-root cgroup that holds a process, and the supervisor holds its own cgroup, so v2 works
  where fleetd runs in a root cgroup (of the host or of a cgroup namespace) or under a parent
  that already delegates memory. fleetd does not move itself into a sub-cgroup to get around
  the rule: it says why v2 is not usable instead, and falls back to v1.
- ``"v1"``: the legacy memory hierarchy (``memory.limit_in_bytes``), where our own memory
  cgroup directory accepts a child (probed: a mkdir and an rmdir). It OOM-kills inside the
  limit like v2, but has no ``memory.oom.group``: the kernel kills one process of the tree.
- ``"none"``: neither, e.g. no root, a read-only cgroupfs, or (this build machine's v2) a
  unified hierarchy whose only controller is hugetlb.

Nothing here is cached: ``fleetd check`` and ``fleetd start`` each ask once.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
from dataclasses import dataclass
from pathlib import Path

import psutil

MECHANISMS = ("v2", "v1", "none")
UNLIMITED = 1 << 60  # v1 writes "no limit" as 0x7FFFFFFFFFFFF000; anything this large is none


@dataclass(frozen=True, slots=True)
class MemoryCgroup:
    """Which cgroup memory mechanism this process can use for its workers, and where."""

    mechanism: str  # one of MECHANISMS
    path: Path | None  # our own cgroup's directory in that hierarchy; None for "none"
    reason: str  # one line: why this mechanism (and why not the better one)

    @property
    def available(self) -> bool:
        return self.mechanism != "none"

    def describe(self) -> str:
        """``v1 (/sys/fs/cgroup/memory/x: ...)`` for logs and ``fleetd check``."""
        return f"{self.mechanism} ({self.reason})"


# ---- /proc parsing -----------------------------------------------------------------------


def _unescape(field: str) -> str:
    r"""mountinfo escapes space, tab, newline and backslash as \040, \011, \012, \134."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def cgroup_paths(proc: str = "/proc/self") -> dict[str, str]:
    """Our cgroup path per hierarchy: ``{"memory": "/a/b", ..., "": "/"}`` ("" is v2)."""
    paths: dict[str, str] = {}
    try:
        with open(f"{proc}/cgroup") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                for name in controllers.split(",") if controllers else [""]:
                    paths[name] = path
    except (OSError, ValueError):
        pass
    return paths


def cgroup_mounts(proc: str = "/proc/self") -> dict[str, tuple[Path, str]]:
    """Mounted cgroup hierarchies: ``{"memory": (mount point, mount root), "": (...)}``; the
    key "" is the unified (v2) hierarchy. The first mount of each wins."""
    mounts: dict[str, tuple[Path, str]] = {}
    try:
        with open(f"{proc}/mountinfo") as f:
            lines = f.readlines()
    except OSError:
        return mounts
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        root, point = _unescape(fields[3]), Path(_unescape(fields[4]))
        fstype, options = tail[0], tail[2].split(",")
        if fstype == "cgroup2":
            mounts.setdefault("", (point, root))
        elif fstype == "cgroup":
            for option in options:
                mounts.setdefault(option, (point, root))
    return mounts


def cgroup_dir(hierarchy: str, proc: str = "/proc/self") -> Path | None:
    """The directory of our own cgroup in ``hierarchy`` ("memory", "cpu", "" for v2), or None
    when it is not mounted or we sit outside what the mount shows."""
    path = cgroup_paths(proc).get(hierarchy)
    mount = cgroup_mounts(proc).get(hierarchy)
    if path is None or mount is None:
        return None
    point, root = mount
    if root != "/":
        if path != root and not path.startswith(root.rstrip("/") + "/"):
            return None
        path = path[len(root) :] or "/"
    return point / path.lstrip("/")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _size(text: str | None) -> int | None:
    """A cgroup size file's value in bytes; None for "max", unlimited or unreadable."""
    if text is None or not text.isdigit():
        return None
    value = int(text)
    return value if value < UNLIMITED else None


# ---- cores and memory --------------------------------------------------------------------


def cores() -> int:
    """CPUs this process may run on (its affinity mask, which containers and taskset narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cpu_quota() -> float | None:
    """The CPU bandwidth our cgroup allows, in cores (2.5 for 250ms per 100ms); None if none.
    v2 ``cpu.max`` or v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``."""
    v2 = cgroup_dir("")
    if v2 is not None:
        parts = (_read(v2 / "cpu.max") or "").split()
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit() and int(parts[1]) > 0:
            return int(parts[0]) / int(parts[1])
    v1 = cgroup_dir("cpu")
    if v1 is not None:
        quota, period = _read(v1 / "cpu.cfs_quota_us"), _read(v1 / "cpu.cfs_period_us")
        if quota and period and quota.isdigit() and period.isdigit() and int(period) > 0:
            return int(quota) / int(period)
    return None


def usable_cores() -> int:
    """``cores()``, lowered to the cgroup's CPU quota (rounded up) when there is one."""
    quota = cpu_quota()
    n = cores()
    return max(1, min(n, math.ceil(quota))) if quota else n


def cgroup_memory_limit() -> int | None:
    """The memory limit of our own cgroup, ancestors included, in bytes; None if unlimited.
    v2: the smallest ``memory.max`` from our cgroup up to the mount's root; v1:
    ``hierarchical_memory_limit`` in ``memory.stat`` (else ``memory.limit_in_bytes``)."""
    found: list[int] = []
    v2 = cgroup_dir("")
    if v2 is not None and "" in cgroup_mounts():
        point = cgroup_mounts()[""][0]
        d = v2
        while True:
            value = _size(_read(d / "memory.max"))
            if value is not None:
                found.append(value)
            if d == point or d.parent == d:
                break
            d = d.parent
    v1 = cgroup_dir("memory")
    if v1 is not None:
        stat = dict(line.split(" ", 1) for line in (_read(v1 / "memory.stat") or "").splitlines())
        hierarchical = stat.get("hierarchical_memory_limit")
        value = _size(hierarchical) or _size(_read(v1 / "memory.limit_in_bytes"))
        if value is not None:
            found.append(value)
    return min(found) if found else None


def total_memory() -> int:
    """Memory this host gives us, in bytes: physical memory, or the cgroup limit when lower
    (a container's limit is what sizing must respect)."""
    physical = psutil.virtual_memory().total
    limit = cgroup_memory_limit()
    return min(physical, limit) if limit else physical


# ---- cgroup memory detection -------------------------------------------------------------


def memory_cgroup(proc: str = "/proc/self") -> MemoryCgroup:
    """Which cgroup memory mechanism this process can use for per-worker cgroups (see the
    module doc). Probes v2 (may write ``+memory`` to our ``cgroup.subtree_control``, which
    only succeeds where it is allowed and changes nothing for processes already there), then
    v1 (a mkdir and rmdir of a probe child). Never raises."""
    v2, why_not_v2 = _probe_v2(proc)
    if v2 is not None:
        return MemoryCgroup("v2", v2, f"memory controller delegated to children of {v2}")
    v1, why_not_v1 = _probe_v1(proc)
    if v1 is not None:
        return MemoryCgroup("v1", v1, f"{v1} accepts child cgroups; v2 not usable: {why_not_v2}")
    return MemoryCgroup("none", None, f"v2: {why_not_v2}; v1: {why_not_v1}")


def _probe_v2(proc: str) -> tuple[Path | None, str]:
    if "" not in cgroup_mounts(proc):
        return None, "no cgroup2 hierarchy mounted"
    d = cgroup_dir("", proc)
    if d is None or not d.is_dir():
        return None, "our cgroup v2 directory is not visible in the mounted hierarchy"
    controllers = (_read(d / "cgroup.controllers") or "").split()
    if "memory" not in controllers:
        shown = " ".join(controllers) or "none"
        return None, f"{d} has no memory controller (controllers: {shown})"
    if not os.access(d, os.W_OK):
        return None, f"{d} is not writable by uid {os.geteuid()}"
    if "memory" in (_read(d / "cgroup.subtree_control") or "").split():
        return d, ""
    try:
        (d / "cgroup.subtree_control").write_text("+memory")
    except OSError as exc:
        if exc.errno == errno.EBUSY:  # the no-internal-processes rule
            return None, (
                f"{d} holds processes (fleetd's own among them), so cgroup v2 cannot give "
                "its children the memory controller; run fleetd in a cgroup whose parent "
                "delegates memory"
            )
        return None, f"cannot enable memory in {d}/cgroup.subtree_control: {exc.strerror}"
    return d, ""


def _probe_v1(proc: str) -> tuple[Path | None, str]:
    if "memory" not in cgroup_mounts(proc):
        return None, "no cgroup v1 memory hierarchy mounted"
    d = cgroup_dir("memory", proc)
    if d is None or not (d / "memory.limit_in_bytes").exists():
        return None, "our v1 memory cgroup directory is not visible in the mounted hierarchy"
    probe = d / f"fleetd-probe-{os.getpid()}"
    try:
        probe.mkdir()
    except FileExistsError:
        pass
    except OSError as exc:
        return None, f"cannot create a child cgroup in {d}: {exc.strerror}"
    try:
        if not (probe / "memory.limit_in_bytes").exists():
            return None, f"a child of {d} has no memory.limit_in_bytes"
        if not os.access(probe / "cgroup.procs", os.W_OK):
            return None, f"cannot move processes into a child of {d}"
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()
    return d, ""
