"""``MemoryCgroups`` decisions on a fake cgroup tree (plain folders and files in a temporary
folder): when a kernel OOM kill inside a worker's cgroup becomes ``memory_limit``, and when it
does not. Real cgroups are exercised in tests/integration/test_memcg.py."""

from __future__ import annotations

import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from supervisor.host import MemoryCgroup
from supervisor.model import ErrorKind
from supervisor.policy import KillReason
from supervisor.run.exits import classify_exit
from supervisor.run.memcg import MARGIN, MemoryCgroups
from supervisor.run.workerproc import WorkerHandle

MIB = 1024 * 1024
SIGKILLED = signal.SIGKILL  # a wait status: killed by SIGKILL, no core


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A real process in a group of its own, so a worker's kill (killpg) hits only it."""
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
def memcg(tmp_path: Path) -> MemoryCgroups:
    m = MemoryCgroups(pid=4242, detect=lambda: MemoryCgroup("v1", tmp_path, "fake"))
    m.start()
    return m


def worker(pid: int, state: str = "busy", job_id: int | None = 7) -> WorkerHandle:
    w = WorkerHandle(pool="p", slot=1, pid=pid, sock=socket.socketpair()[0], spawned_at=0.0)
    w.state = state
    if job_id is not None:
        w.running[job_id] = SimpleNamespace(claimed=SimpleNamespace(job_id=job_id))  # type: ignore[assignment]
    return w


def attached(memcg: MemoryCgroups, w: WorkerHandle) -> Path:
    memcg.attach(w, 256 * MIB)
    path = memcg.path_of(w.pid)
    assert path is not None
    (path / "cgroup.procs").write_text("")  # a fake cgroup: nobody is really in it
    (path / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    (path / "memory.max_usage_in_bytes").write_text(str(384 * MIB))
    return path


def oom(path: Path, count: int = 1) -> None:
    (path / "memory.oom_control").write_text(f"oom_kill_disable 0\nunder_oom 0\noom_kill {count}\n")


def test_attach_writes_the_limit_with_the_margin_and_the_pid(
    memcg: MemoryCgroups, tmp_path: Path
) -> None:
    w = worker(31337)
    memcg.attach(w, 256 * MIB)
    path = tmp_path / "fleetd-4242" / "p-1-31337"
    assert memcg.path_of(31337) == path
    assert int((path / "memory.limit_in_bytes").read_text()) == 256 * MIB + MARGIN
    assert int((path / "memory.memsw.limit_in_bytes").read_text()) == 256 * MIB + MARGIN
    assert (path / "cgroup.procs").read_text() == "31337"


def test_no_memory_limit_no_cgroup(memcg: MemoryCgroups) -> None:
    w = worker(31337)
    memcg.attach(w, None)
    assert memcg.path_of(31337) is None


def test_a_worker_sigkilled_after_an_oom_kill_in_its_cgroup_ends_memory_limit(
    memcg: MemoryCgroups,
) -> None:
    w = worker(31337)
    oom(attached(memcg, w))
    memcg.worker_exited(w, SIGKILLED, now=12.5)
    assert w.kill_reason is not None and w.kill_reason.kind == "memory_limit"
    # booked as any kill is: against the job it ran, at the time it was noticed (a reason
    # without its job made the dispatcher release the job uncounted, run after run)
    assert w.kill_target == 7 and w.killed_at == 12.5
    assert "killed by the kernel at its cgroup limit of 384MiB" in w.kill_reason.detail
    assert "memory_limit 256MiB + 128MiB margin; cgroup peak 384MiB" in w.kill_reason.detail
    verdict = classify_exit(SIGKILLED, w.kill_reason)
    assert verdict.error_kind is ErrorKind.MEMORY_LIMIT
    assert memcg.oom_kills == 1


@pytest.mark.parametrize(
    ("status", "state", "reason", "oom_count"),
    [
        (SIGKILLED, "busy", None, 0),  # SIGKILL from someone else: crashed, as before
        (3 << 8, "busy", None, 1),  # exited with a code: not the OOM killer
        (SIGKILLED, "busy", KillReason("timeout", "ran past"), 1),  # our own reason wins
        (SIGKILLED, "starting", None, 1),  # a boot failure stays one (backoff)
    ],
)
def test_other_ends_are_left_alone(
    memcg: MemoryCgroups, status: int, state: str, reason: KillReason | None, oom_count: int
) -> None:
    w = worker(31337, state=state)
    w.kill_reason = reason
    oom(attached(memcg, w), oom_count)
    memcg.worker_exited(w, status, now=1.0)
    assert w.kill_reason == reason


def test_an_oom_kill_of_a_subprocess_stops_the_worker_before_its_failure_is_believed(
    memcg: MemoryCgroups, sleeper: subprocess.Popen[bytes]
) -> None:
    w = worker(sleeper.pid)
    path = attached(memcg, w)
    assert not memcg.failed_by_oom(w, now=1.0)  # no OOM kill: the failure is believed
    assert w.kill_reason is None
    oom(path)
    assert memcg.failed_by_oom(w, now=1.0)
    assert w.kill_reason is not None and w.kill_reason.kind == "memory_limit"
    assert "OOM-killed 1 process(es) of the job" in w.kill_reason.detail
    assert sleeper.wait(5) == -signal.SIGKILL


def test_an_oom_kill_seen_at_a_slot_jobs_failure_is_about_that_job(
    memcg: MemoryCgroups, sleeper: subprocess.Popen[bytes]
) -> None:
    # a worker with slots runs 7 (the oldest) and 8; 8's handler failed after the kernel
    # OOM-killed its subprocess: the kill is about 8 (it ends memory_limit), 7 is released
    w = worker(sleeper.pid)
    w.slots = 2
    w.running[8] = SimpleNamespace(claimed=SimpleNamespace(job_id=8))  # type: ignore[assignment]
    oom(attached(memcg, w))
    assert memcg.failed_by_oom(w, now=1.0, job_id=8)
    assert w.kill_reason is not None and w.kill_reason.kind == "memory_limit"
    assert w.kill_target == 8


def test_inspect_polls_busy_workers_once_per_period(
    memcg: MemoryCgroups, sleeper: subprocess.Popen[bytes]
) -> None:
    w = worker(sleeper.pid)
    path = attached(memcg, w)
    memcg.inspect([w], now=1.0)
    oom(path)
    memcg.inspect([w], now=1.001)  # within the period: not read again
    assert w.kill_reason is None
    memcg.inspect([w], now=1.05)
    assert w.kill_reason is not None and w.kill_reason.kind == "memory_limit"


def test_disabled_by_config(tmp_path: Path) -> None:
    m = MemoryCgroups(enabled=False, detect=lambda: MemoryCgroup("v1", tmp_path, "fake"))
    found = m.start()
    assert (found.mechanism, m.version) == ("none", "none")
    assert "memory_cgroup = false" in found.reason
    assert not list(tmp_path.iterdir())


class FakeTree(MemoryCgroups):
    """On a plain folder, mkdir makes no ``cgroup.procs``: make it, as the kernel does."""

    def _make_limited(self, path: Path, limit: int) -> None:
        super()._make_limited(path, limit)
        (path / "cgroup.procs").touch()


@pytest.fixture
def fake(tmp_path: Path) -> MemoryCgroups:
    m = FakeTree(pid=4242, detect=lambda: MemoryCgroup("v1", tmp_path, "fake"))
    m.start()
    return m


def prepared_worker(memcg: MemoryCgroups, pid: int, usage: int = MIB, oom_count: int = 0) -> Path:
    """A worker forked into a prepared cgroup (as ``Children.fork`` does), then reaped cleanly
    with ``usage`` bytes still charged to its cgroup; the cgroup's path."""
    prepared = memcg.prepare("p", 1, 256 * MIB)
    assert prepared is not None
    w = worker(pid)
    memcg.adopt(w, prepared)
    path = memcg.path_of(pid)
    assert path is not None
    (path / "cgroup.procs").write_text("")
    oom(path, oom_count)
    (path / "memory.usage_in_bytes").write_text(str(usage))
    (path / "memory.max_usage_in_bytes").write_text(str(300 * MIB))
    memcg.worker_exited(w, 0, now=1.0)
    return path


def test_an_emptied_cgroup_is_handed_to_the_next_worker_with_its_counters_as_baseline(
    fake: MemoryCgroups,
) -> None:
    memcg = fake
    # its earlier worker's job had a subprocess OOM-killed: that count is not the next one's
    first = prepared_worker(memcg, 1001, oom_count=2)
    assert first.name == "p-1-1001" and first.is_dir()
    assert (first / "memory.max_usage_in_bytes").read_text() == "0"  # the peak starts anew
    prepared = memcg.prepare("p", 1, 256 * MIB)
    assert prepared is not None and prepared.path == first and prepared.oom_seen == 2
    w = worker(1002)
    memcg.adopt(w, prepared)
    assert memcg.path_of(1002) == first.with_name("p-1-1002") and not first.exists()
    assert not memcg.failed_by_oom(w, now=2.0)  # count still 2: no new kill
    oom(first.with_name("p-1-1002"), 3)
    assert memcg.failed_by_oom(w, now=2.0)  # a kill of its own


@pytest.mark.parametrize(
    ("usage", "procs", "limit", "reused"),
    [
        (MIB, "", 256 * MIB, True),
        (64 * MIB, "", 256 * MIB, False),  # files a job left in /dev/shm are charged to it
        (MIB, "4321\n", 256 * MIB, False),  # a job's process still in it: swept, removed
        (MIB, "", 512 * MIB, False),  # another pool's limit: a cgroup of its own
    ],
)
def test_what_is_not_handed_on(
    fake: MemoryCgroups, usage: int, procs: str, limit: int, reused: bool
) -> None:
    memcg = fake
    prepared = memcg.prepare("p", 1, 256 * MIB)
    assert prepared is not None
    w = worker(1001)
    memcg.adopt(w, prepared)
    path = memcg.path_of(1001)
    assert path is not None
    (path / "cgroup.procs").write_text(procs)
    oom(path, 0)
    (path / "memory.usage_in_bytes").write_text(str(usage))
    memcg.worker_exited(w, 0, now=1.0)
    again = memcg.prepare("p", 1, limit)
    assert again is not None
    assert (again.path == path) is reused
    # taken, or never kept; one of another limit waits for a worker of its own pool
    assert [cg.path for cg in memcg.reusable] == ([path] if limit != 256 * MIB else [])


def test_at_most_reuse_at_most_kept_and_all_removed_at_close(fake: MemoryCgroups) -> None:
    memcg = fake
    from supervisor.run.memcg import REUSE_AT_MOST

    prepared = [memcg.prepare("p", 1, 256 * MIB) for _ in range(REUSE_AT_MOST + 2)]
    handles = [worker(2000 + i) for i in range(len(prepared))]
    for w, p in zip(handles, prepared, strict=True):
        assert p is not None
        memcg.adopt(w, p)
    for w in handles:
        path = memcg.path_of(w.pid)
        assert path is not None
        (path / "cgroup.procs").write_text("")
        oom(path, 0)
        (path / "memory.usage_in_bytes").write_text(str(MIB))
        memcg.worker_exited(w, 0, now=1.0)
    assert len(memcg.reusable) == REUSE_AT_MOST
    # the oldest two were removed (here: rmdir of a fake tree fails), the newest kept
    assert [cg.path.name for cg in memcg.reusable] == [f"p-1-{w.pid}" for w in handles[2:]]
    assert len(memcg.pending) == 2
    kept = [cg.path for cg in memcg.reusable]
    memcg.close()
    assert memcg.reusable == []
    assert all(path in memcg.pending for path in kept)  # the fake tree's files stop rmdir
