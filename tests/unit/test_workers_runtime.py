"""The child runtime in real forked workers, driven over a socketpair like the parent does.

Every wait is on an event (a frame, an exit seen through a pidfd), never a fixed sleep.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import json
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from workers import JobContext, current_job, exitcodes, limits, logs, protocol
from workers.context import bind, unbind
from workers.errors import HandlerImportError
from workers.handlers import load_handlers, resolve
from workers.protocol import JobDone, JobFailed, Ping, Pong, Ready, Recycling, RunJob
from workers.runtime import WorkerSpec, main
from workers.spec import NEAR_LIMIT

MIB = 1024 * 1024
PR_SET_CHILD_SUBREAPER = 36
KINDS = [
    "noop",
    "echo",
    "sleep",
    "permanent",
    "boom",
    "instant_bomb",
    "gradual_bomb",
    "allocate",
    "allocate_in_thread",
    "leak",
    "warm_cache",
    "whoami",
    "unserialisable",
    "crash_exit",
    "hang",
    "fork_children",
]
HANDLERS = load_handlers({k: f"tests.support.handlers:{k}" for k in KINDS})


def _cmdline(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read()


class Worker:
    """A forked worker and the parent's end of its connection."""

    def __init__(self, cancel_slot: protocol.CancelSlot | None = None, **spec: Any) -> None:
        spec.setdefault("parent_pid", os.getpid())
        spec.setdefault("handlers", HANDLERS)
        self.spec = WorkerSpec(pool="test", slot=1, **spec)
        parent, child = socket.socketpair()
        sys.stdout.flush()
        sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:  # pragma: no cover - the child ends in os._exit
            try:
                parent.close()
                main(child.fileno(), self.spec, cancel_slot)
            finally:
                os._exit(99)
        child.close()
        parent.setblocking(False)
        self.sock = parent
        self.reader = protocol.FrameReader()
        self.inbox: collections.deque[protocol.Message] = collections.deque()
        self.next_id = 1
        self.status: int | None = None

    def send(self, msg: protocol.Message) -> None:
        self.sock.sendall(protocol.encode(msg))

    def recv(self, timeout: float = 5.0) -> protocol.Message:
        """The next frame from the worker; EOFError if it closed, TimeoutError if none came."""
        deadline = time.monotonic() + timeout
        while not self.inbox:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                raise TimeoutError("no frame from the worker")
            got, eof, _ = self.reader.drain(self.sock.fileno())
            self.inbox.extend(got)
            if eof and not self.inbox:
                raise EOFError("the worker closed its end")
        return self.inbox.popleft()

    def run(self, kind: str, payload: Any = None, attempt: int = 1) -> protocol.Message:
        """Send one job and return its JobDone or JobFailed."""
        job_id = self.next_id
        self.next_id += 1
        body = json.dumps({} if payload is None else payload)
        self.send(RunJob(job_id, kind, body, attempt, time.time() + 60, f"tok-{job_id}"))
        first = self.recv()
        assert isinstance(first, JobDone | JobFailed) and first.job_id == job_id, first
        return first

    def wait_running(self, job_id: int, timeout: float = 5.0) -> None:
        """Until the worker's title says it runs ``job_id`` (set just before the handler)."""
        deadline = time.monotonic() + timeout
        while f"job={job_id} ".encode() not in _cmdline(self.pid):
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} did not start")
            time.sleep(0.002)

    def ready(self) -> Ready:
        msg = self.recv()
        assert msg == Ready(self.pid)
        return msg

    def wait_exit(self, timeout: float = 5.0) -> int:
        """The exit code (or minus the signal number), waiting on a pidfd."""
        if self.status is None:
            pidfd = os.pidfd_open(self.pid)
            try:
                if not select.select([pidfd], [], [], timeout)[0]:
                    raise TimeoutError(f"worker {self.pid} still running")
            finally:
                os.close(pidfd)
            _, self.status = os.waitpid(self.pid, 0)
        if os.WIFSIGNALED(self.status):
            return -os.WTERMSIG(self.status)
        return os.WEXITSTATUS(self.status)

    def alive(self) -> bool:
        return self.status is None and os.waitpid(self.pid, os.WNOHANG) == (0, 0)

    def cleanup(self) -> None:
        self.sock.close()
        if self.status is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            _, self.status = os.waitpid(self.pid, 0)


@pytest.fixture
def spawn() -> Iterator[Callable[..., Worker]]:
    workers: list[Worker] = []

    def make(**spec: Any) -> Worker:
        w = Worker(**spec)
        workers.append(w)
        return w

    yield make
    for w in workers:
        w.cleanup()


def test_echo_returns_the_payload_with_duration_and_peak(spawn: Callable[..., Worker]) -> None:
    w = spawn()
    w.ready()
    done = w.run("echo", {"doc": 42, "name": "é"})
    assert isinstance(done, JobDone)
    assert json.loads(done.result) == {"doc": 42, "name": "é"}
    assert done.duration >= 0 and done.peak_rss and done.peak_rss > MIB


def test_handler_sees_its_job_context_and_the_title_says_busy(
    spawn: Callable[..., Worker],
) -> None:
    w = spawn()
    w.ready()
    done = w.run("whoami", attempt=3)
    assert isinstance(done, JobDone)
    seen = json.loads(done.result)
    assert (seen["pid"], seen["job"], seen["kind"], seen["attempt"]) == (w.pid, 1, "whoami", 3)
    assert seen["pool"] == "test" and seen["deadline"] > time.time()
    assert seen["title"] == "fleetd: test#1 job=1 whoami 0s"
    with open(f"/proc/{w.pid}/cmdline", "rb") as f:
        assert f.read().split(b"\0")[0] == b"fleetd: test#1 idle"


def test_permanent_is_reported_as_permanent(spawn: Callable[..., Worker]) -> None:
    w = spawn()
    w.ready()
    failed = w.run("permanent", {"message": "payload has no 'doc'"})
    assert isinstance(failed, JobFailed)
    assert failed.error_kind == "permanent"
    assert failed.message == "Permanent: payload has no 'doc'"


def test_exception_is_reported_with_message_and_traceback_tail(
    spawn: Callable[..., Worker],
) -> None:
    w = spawn()
    w.ready()
    failed = w.run("boom", {"message": "bad\ninput"})
    assert isinstance(failed, JobFailed)
    assert failed.error_kind == "exception"
    assert failed.message == "ValueError: bad input"
    assert "handlers.py" in failed.traceback_tail and "in boom" in failed.traceback_tail
    assert "outcome.py" not in failed.traceback_tail  # the runtime's own frame is left out
    assert isinstance(w.run("echo", {"still": "alive"}), JobDone)


def test_instant_bomb_under_256_mib_is_memory_limit_and_the_worker_survives(
    spawn: Callable[..., Worker],
) -> None:
    w = spawn(memory_limit=256 * MIB)
    w.ready()
    failed = w.run("instant_bomb", {"gib": 8})
    assert isinstance(failed, JobFailed)
    assert failed.error_kind == "memory_limit"
    assert "MemoryError" in failed.message and "RLIMIT_DATA" in failed.message
    assert "memory_limit 256 MiB" in failed.message and "peak RSS" in failed.message
    assert failed.duration < 1.0
    w.send(Ping(1))
    assert isinstance(w.recv(), Pong)
    done = w.run("echo", {"next": 1})
    assert isinstance(done, JobDone) and json.loads(done.result) == {"next": 1}


def test_gradual_bomb_is_stopped_by_the_rlimit_at_limit_plus_headroom(
    spawn: Callable[..., Worker],
) -> None:
    w = spawn(memory_limit=128 * MIB, rlimit_headroom=64 * MIB)
    w.ready()
    failed = w.run("gradual_bomb", {"chunk_mib": 16, "interval": 0, "max_mib": 4096})
    assert isinstance(failed, JobFailed) and failed.error_kind == "memory_limit"
    assert failed.peak_rss is not None and failed.peak_rss < 1024 * MIB
    assert isinstance(w.run("noop"), JobDone)


def test_address_space_policy_also_refuses_the_instant_bomb(
    spawn: Callable[..., Worker],
) -> None:
    w = spawn(memory_limit=256 * MIB, rlimit_policy="as")
    w.ready()
    failed = w.run("instant_bomb")
    assert isinstance(failed, JobFailed) and failed.error_kind == "memory_limit"
    assert "RLIMIT_AS" in failed.message


def test_peak_rss_is_reset_between_jobs(spawn: Callable[..., Worker]) -> None:
    w = spawn()
    w.ready()
    big = w.run("allocate", {"mib": 100})
    small = w.run("noop")
    assert isinstance(big, JobDone) and isinstance(small, JobDone)
    assert big.peak_rss is not None and small.peak_rss is not None
    assert big.peak_rss >= 100 * MIB
    assert small.peak_rss < big.peak_rss - 80 * MIB


def test_a_fresh_workers_first_job_counts_its_peak_from_the_fork(
    spawn: Callable[..., Worker],
) -> None:
    # the first job takes the peak since the fork (limits.peak_since_start, no reset): it is
    # the worker's own, not the larger one its parent once had
    spike = bytearray(200 * MIB)
    spike[::4096] = b"x" * len(spike[::4096])
    del spike  # the parent's peak stays 200 MiB above its RSS
    rss = limits.current_rss() or 0
    w = spawn(max_jobs_per_worker=1)
    w.ready()
    done = w.run("allocate", {"mib": 40})
    assert isinstance(done, JobDone) and done.peak_rss is not None
    assert 40 * MIB <= done.peak_rss < rss + 100 * MIB, (done.peak_rss, rss)


def test_a_peak_left_by_an_ended_thread_is_not_the_next_jobs_peak(
    spawn: Callable[..., Worker],
) -> None:
    w = spawn()
    w.ready()
    big = w.run("allocate_in_thread", {"mib": 150})
    small, mid = w.run("noop"), w.run("allocate", {"mib": 40})
    assert isinstance(big, JobDone) and isinstance(small, JobDone) and isinstance(mid, JobDone)
    assert big.peak_rss is not None and small.peak_rss is not None and mid.peak_rss is not None
    assert big.peak_rss >= 150 * MIB
    assert small.peak_rss < big.peak_rss - 120 * MIB
    assert small.peak_rss + 30 * MIB < mid.peak_rss < big.peak_rss - 80 * MIB


def test_recycles_after_max_jobs_per_worker(spawn: Callable[..., Worker]) -> None:
    w = spawn(max_jobs_per_worker=2)
    w.ready()
    assert isinstance(w.run("noop"), JobDone)
    assert isinstance(w.run("noop"), JobDone)
    msg = w.recv()
    assert isinstance(msg, Recycling) and "max_jobs_per_worker" in msg.reason
    assert w.wait_exit() == exitcodes.RECYCLE


def test_a_forked_child_reads_its_own_figures_not_its_parents() -> None:
    """The kept /proc/self fds are forgotten at fork: one inherited still points at the
    parent's entry, whose RSS would not grow with what the child allocates."""
    assert limits.current_rss() is not None  # the fd is kept open here, in the parent
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child ends in os._exit
        try:
            before = limits.current_rss()
            block = bytearray(100 * MIB)
            block[::4096] = b"x" * len(block[::4096])
            os.write(w, f"{before} {limits.current_rss()}".encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as pipe:
        before, after = map(int, pipe.read().split())
    os.waitpid(pid, 0)
    assert after - before >= 90 * MIB, (before, after)


@pytest.mark.alone  # its RSS is sampled against a deadline: no neighbour's load
def test_recycles_when_rss_stays_above_recycle_rss(spawn: Callable[..., Worker]) -> None:
    # the threshold from a worker's own RSS after the same first job, not the test process's:
    # a forked worker holds only the parent's pages it maps (a long test run's process has
    # file-backed pages a fresh child has not touched: the full suite's read far above it)
    probe = spawn()
    probe.ready()
    assert isinstance(probe.run("allocate", {"mib": 100}), JobDone)
    probe.send(Ping(1))
    pong = probe.recv()
    assert isinstance(pong, Pong) and pong.rss
    probe.cleanup()
    w = spawn(recycle_rss=pong.rss + 64 * MIB)
    w.ready()
    assert isinstance(w.run("allocate", {"mib": 100}), JobDone)  # freed: no recycle
    w.send(Ping(1))
    assert isinstance(w.recv(), Pong)
    assert isinstance(w.run("leak", {"mib": 100}), JobDone)  # kept: recycle
    msg = w.recv()
    assert isinstance(msg, Recycling) and "recycle_rss" in msg.reason
    assert w.wait_exit() == exitcodes.RECYCLE


def test_a_worker_leaking_toward_memory_limit_is_replaced_between_jobs(
    spawn: Callable[..., Worker],
) -> None:
    """No recycle_rss: RSS after a job within 1/8 of memory_limit replaces the worker, so the
    parent's watchdog need not kill it mid-job (failing the job then running)."""
    baseline = limits.current_rss() or 0
    w = spawn(memory_limit=baseline + 96 * MIB)
    w.ready()
    answers = []
    for seq in range(8):
        assert isinstance(w.run("leak", {"mib": 20}), JobDone)
        w.send(Ping(seq))  # answered while it lives; a Recycling comes first when it leaves
        answers.append(w.recv())
        if isinstance(answers[-1], Recycling):
            break
    *alive, last = answers
    assert all(isinstance(a, Pong) for a in alive) and len(alive) >= 2  # not at once
    assert isinstance(last, Recycling) and "near memory_limit" in last.reason, answers
    assert w.wait_exit() == exitcodes.RECYCLE


def test_a_worker_its_first_job_left_near_memory_limit_is_not_replaced_after_each_job(
    spawn: Callable[..., Worker],
) -> None:
    """What the first job loads and keeps (a model, a cache) is not a leak: a fresh worker
    would load it again, so the guard stays off for that worker."""
    baseline = limits.current_rss() or 0
    w = spawn(memory_limit=baseline + 64 * MIB)
    w.ready()
    for seq in range(3):
        assert isinstance(w.run("warm_cache", {"mib": 60}), JobDone)
        w.send(Ping(seq))
        pong = w.recv()
        assert isinstance(pong, Pong), pong
    assert pong.rss and pong.rss > int((baseline + 64 * MIB) * NEAR_LIMIT) - 16 * MIB


def test_ping_is_answered_with_rss(spawn: Callable[..., Worker]) -> None:
    w = spawn()
    w.ready()
    w.send(Ping(41))
    pong = w.recv()
    assert isinstance(pong, Pong) and pong.seq == 41 and pong.rss and pong.rss > MIB


def test_shutdown_exits_ok(spawn: Callable[..., Worker]) -> None:
    w = spawn()
    w.ready()
    w.send(protocol.Shutdown())
    assert w.wait_exit() == exitcodes.OK


def test_exits_when_the_parent_closes_its_end(spawn: Callable[..., Worker]) -> None:
    w = spawn()
    w.ready()
    w.sock.close()
    assert w.wait_exit() == exitcodes.PARENT_GONE


def test_a_bad_frame_exits_protocol_error(spawn: Callable[..., Worker]) -> None:
    w = spawn()
    w.ready()
    w.sock.sendall(protocol.HEADER.pack(5) + b"hello")
    assert w.wait_exit() == exitcodes.PROTOCOL_ERROR


def test_sigterm_and_sigint_are_ignored_even_mid_job(spawn: Callable[..., Worker]) -> None:
    w = spawn()
    w.ready()
    w.send(RunJob(1, "sleep", json.dumps({"seconds": 1.0}), 1, time.time() + 60, "t"))
    w.wait_running(1)
    os.kill(w.pid, signal.SIGTERM)
    os.kill(w.pid, signal.SIGINT)
    done = w.recv()
    assert isinstance(done, JobDone) and json.loads(done.result) == 1.0
    assert w.alive()


def test_parent_signal_handlers_are_not_inherited(spawn: Callable[..., Worker]) -> None:
    previous = signal.signal(signal.SIGUSR2, lambda *_: None)
    try:
        w = spawn()
    finally:
        signal.signal(signal.SIGUSR2, previous)
    w.ready()
    os.kill(w.pid, signal.SIGUSR2)  # default action again: terminate
    assert w.wait_exit() == -signal.SIGUSR2


def test_a_handler_that_exits_takes_the_worker_with_it(spawn: Callable[..., Worker]) -> None:
    w = spawn()
    w.ready()
    w.send(RunJob(1, "crash_exit", json.dumps({"code": 3}), 1, time.time() + 60, "t"))
    assert w.wait_exit() == 3


def test_result_that_is_not_json_is_an_exception(spawn: Callable[..., Worker]) -> None:
    w = spawn()
    w.ready()
    failed = w.run("unserialisable")
    assert isinstance(failed, JobFailed) and failed.error_kind == "exception"
    assert failed.message.startswith("result is not JSON-serialisable: TypeError")


def test_unknown_kind_and_invalid_payload(spawn: Callable[..., Worker]) -> None:
    w = spawn()
    w.ready()
    failed = w.run("no_such_kind")
    assert isinstance(failed, JobFailed) and failed.error_kind == "exception"
    assert "no handler for kind 'no_such_kind'" in failed.message
    w.send(RunJob(9, "echo", "{not json", 1, time.time() + 60, "t"))
    failed = w.recv()
    assert isinstance(failed, JobFailed) and failed.error_kind == "permanent"
    assert "not valid JSON" in failed.message


def test_exits_parent_gone_when_the_parent_pid_is_not_the_expected_one(
    spawn: Callable[..., Worker],
) -> None:
    w = spawn(parent_pid=1)
    assert w.wait_exit() == exitcodes.PARENT_GONE


def test_dies_with_its_parent() -> None:
    """PR_SET_PDEATHSIG: a middle process forks the worker, then is killed.

    This process becomes a child subreaper for the test, so the orphaned worker is reparented
    here and its end can be collected with waitpid, signal included.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    ours, theirs = socket.socketpair()
    try:
        middle = os.fork()
        if middle == 0:  # pragma: no cover - the child ends in os._exit
            try:
                ours.close()
                spec = WorkerSpec(pool="test", slot=1, handlers=HANDLERS, parent_pid=os.getpid())
                if os.fork() == 0:
                    main(theirs.fileno(), spec)
                theirs.close()
                signal.pause()
            finally:
                os._exit(99)
        theirs.close()
        ready = protocol.read_frame(ours.fileno())
        assert isinstance(ready, Ready)
        os.kill(middle, signal.SIGKILL)
        os.waitpid(middle, 0)
        pidfd = os.pidfd_open(ready.pid)
        try:
            assert select.select([pidfd], [], [], 5.0)[0], "the worker outlived its parent"
        finally:
            os.close(pidfd)
        _, status = os.waitpid(ready.pid, 0)  # reparented to us, so we can collect it
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    finally:
        ours.close()
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping privileges needs root")
def test_drops_privileges_and_still_resets_the_peak(spawn: Callable[..., Worker]) -> None:
    w = spawn(user="nobody")
    w.ready()
    who = w.run("whoami")
    assert isinstance(who, JobDone)
    assert (json.loads(who.result)["uid"], json.loads(who.result)["gid"]) == (65534, 65534)
    big, small = w.run("allocate", {"mib": 100}), w.run("noop")
    assert big.peak_rss is not None and small.peak_rss is not None
    assert big.peak_rss >= 100 * MIB and small.peak_rss < big.peak_rss - 80 * MIB


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping privileges needs root")
def test_nproc_limit_contains_a_fork_bomb(spawn: Callable[..., Worker]) -> None:
    w = spawn(user="nobody", nproc_limit=1)
    w.ready()
    failed = w.run("fork_children", {"n": 5})
    assert isinstance(failed, JobFailed) and failed.error_kind == "exception"
    assert failed.message.startswith("BlockingIOError")
    assert isinstance(w.run("noop"), JobDone)


def test_unknown_user_exits_setup_failed(spawn: Callable[..., Worker]) -> None:
    w = spawn(user="no-such-user-fleetd")
    assert w.wait_exit() == exitcodes.SETUP_FAILED


def test_a_workers_last_words_are_a_json_line_where_the_fleet_logs_json(
    spawn: Callable[..., Worker], capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # what a worker says on its way out (os._exit: no logging) keeps the fleet's format
    monkeypatch.setattr(logs, "json_lines", True)
    w = spawn(user="no-such-user-fleetd")
    assert w.wait_exit() == exitcodes.SETUP_FAILED
    (line,) = [x for x in capfd.readouterr().err.splitlines() if "no-such-user-fleetd" in x]
    record = json.loads(line)
    assert record["level"] == "WARNING" and record["logger"] == "fleetd.worker", record
    assert record["msg"].startswith("worker test#1 (pid ") and "cannot switch to user" in line
    assert "exc" not in record
    # a traceback goes where the supervisor's own lines carry one (the chaos checks read it)
    traced = json.loads(logs.json_line("ERROR", "fleetd.worker", "internal error", "Traceback"))
    assert traced["exc"] == "Traceback" and traced["msg"] == "internal error"


def test_spec_is_checked_before_the_fork() -> None:
    with pytest.raises(ValueError, match="rlimit_policy"):
        WorkerSpec(pool="p", slot=0, handlers={}, parent_pid=1, rlimit_policy="rss")
    with pytest.raises(ValueError, match="memory_limit"):
        WorkerSpec(pool="p", slot=0, handlers={}, parent_pid=1, memory_limit=0)


# --- handler loading and the job context, in this process ---


def test_handler_import_errors_name_the_kind_spec_and_cause(tmp_path: Any, monkeypatch) -> None:
    (tmp_path / "raises_on_import.py").write_text("raise RuntimeError('no config file')\n")
    (tmp_path / "needs_dep.py").write_text("import fleetd_missing_dependency\n")
    (tmp_path / "plain.py").write_text("VALUE = 3\ndef f(p):\n    return p\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cases = {
        "tests.support.nope:render": "module 'tests.support.nope' not found",
        "tests.support.handlers:nope": "'tests.support.handlers' has no attribute 'nope'",
        "plain:VALUE": "'VALUE' is a int, not callable",
        "raises_on_import:f": "import raised RuntimeError: no config file",
        "needs_dep:f": "import raised ModuleNotFoundError: No module named",
        "no_colon": "expected 'module:function'",
    }
    for spec, cause in cases.items():
        with pytest.raises(HandlerImportError) as info:
            load_handlers({"echo": "tests.support.handlers:echo", "render": spec})
        assert str(info.value).startswith(f"handler 'render' ({spec!r}): {cause}")
        assert "\n" not in str(info.value)
    assert resolve("plain:f")(5) == 5


def test_current_job_outside_a_job_raises() -> None:
    with pytest.raises(RuntimeError, match="outside a job"):
        current_job()


def test_current_job_reaches_threads_the_handler_starts() -> None:
    ctx = JobContext(7, "render", 2, time.time() + 5, "bulk")
    seen: list[JobContext] = []
    token = bind(ctx)
    try:
        t = threading.Thread(target=lambda: seen.append(current_job()))
        t.start()
        t.join()
    finally:
        unbind(token)
    assert seen == [ctx] and 0 < ctx.remaining() <= 5
    with pytest.raises(RuntimeError):
        current_job()


def test_soft_timeout_signal_raises_inside_the_handler_only(spawn: Callable[..., Worker]) -> None:
    w = spawn()
    w.ready()
    w.send(protocol.RunJob(1, "sleep", json.dumps({"seconds": 30}), 1, time.time() + 60, "t"))
    failed = None
    while failed is None:  # a signal sent before the handler starts is dropped as stale
        os.kill(w.pid, protocol.SOFT_TIMEOUT_SIGNAL)
        with contextlib.suppress(TimeoutError):
            failed = w.recv(timeout=0.2)
    assert isinstance(failed, protocol.JobFailed) and failed.error_kind == protocol.TIMEOUT
    os.kill(w.pid, protocol.SOFT_TIMEOUT_SIGNAL)  # between jobs: ignored
    w.send(protocol.RunJob(2, "echo", json.dumps({"a": 1}), 1, time.time() + 60, "t"))
    done = w.recv()
    assert isinstance(done, protocol.JobDone) and json.loads(done.result) == {"a": 1}


def test_a_handler_runs_with_no_signal_blocked(spawn: Callable[..., Worker]) -> None:
    """Nothing is blocked while a handler runs (the soft-timeout signal included): the
    threads and programs it starts inherit the mask."""
    w = spawn()
    w.ready()
    done = w.run("whoami")
    assert isinstance(done, JobDone) and json.loads(done.result)["blocked"] == []


def test_jobs_sent_ahead_run_in_order(spawn: Callable[..., Worker]) -> None:
    w = spawn()
    w.ready()
    frames = b"".join(
        protocol.encode(RunJob(i, "echo", json.dumps({"n": i}), 1, time.time() + 60, "t"))
        for i in range(1, 6)
    )
    w.sock.sendall(frames)  # one write: the worker reads them all at once
    results = [w.recv() for _ in range(5)]
    assert [(r.job_id, json.loads(r.result)) for r in results if isinstance(r, JobDone)] == [
        (i, {"n": i}) for i in range(1, 6)
    ]


def test_release_hands_back_the_jobs_not_started(spawn: Callable[..., Worker]) -> None:
    w = spawn()
    w.ready()
    w.send(RunJob(1, "sleep", json.dumps({"seconds": 1.0}), 1, time.time() + 60, "t"))
    w.send(RunJob(2, "echo", json.dumps({}), 1, time.time() + 60, "t"))
    w.send(Ping(5))
    w.send(RunJob(3, "echo", json.dumps({}), 1, time.time() + 60, "t"))
    w.wait_running(1)
    w.send(protocol.Release())
    got = [w.recv() for _ in range(4)]
    # job 1 finishes; 2 and 3 come back unstarted; the Ping between them is still answered
    assert isinstance(got[0], JobDone) and got[0].job_id == 1
    assert got[1:3] == [protocol.Returned(2), protocol.Returned(3)]
    assert isinstance(got[3], Pong) and got[3].seq == 5
    w.send(RunJob(4, "echo", json.dumps({"a": 4}), 1, time.time() + 60, "t"))
    done = w.recv()
    assert isinstance(done, JobDone) and done.job_id == 4  # and it takes new work after


def test_a_worker_with_nothing_left_to_run_says_idle(spawn: Callable[..., Worker]) -> None:
    """Between queued jobs the title keeps naming a job; once nothing is left (here a Release
    took the queued one back) it says idle."""
    w = spawn()
    w.ready()
    w.send(RunJob(1, "sleep", json.dumps({"seconds": 1.0}), 1, time.time() + 60, "t"))
    w.send(RunJob(2, "echo", json.dumps({}), 1, time.time() + 60, "t"))
    w.wait_running(1)
    w.send(protocol.Release())
    assert isinstance(w.recv(), JobDone) and w.recv() == protocol.Returned(2)
    w.send(Ping(1))  # answered only once the worker is back in its read
    assert isinstance(w.recv(), Pong)
    deadline = time.monotonic() + 5
    while b"idle" not in _cmdline(w.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _cmdline(w.pid).split(b"\0")[0] == b"fleetd: test#1 idle"
