"""Command handlers: a job kind that runs a program instead of a Python function.

::

    [pools.media]
    handlers = { pdf_text = { command = ["pdftotext", "-layout", "{path}", "-"],
                              stall_timeout = "30s", permanent_codes = [2, 65] } }

One job, inside the worker (so inside its rlimits, its cgroup and its process group)::

    argv = substitute(command, payload)       {path} <- payload["path"]; missing: permanent
    a fresh empty folder: cwd, HOME, TMPDIR   removed afterwards
    environment: PATH, LANG, LC_*, TZ, FLEETD_JOB_*, the handler's env table; nothing else
    fork + exec, no shell                     SIGINT/SIGTERM back to default, PDEATHSIG
    stdin  <- the payload as JSON             stdout, stderr <- read as they come
    wait for: exit | the job's deadline | stall_timeout without a byte of output
       deadline / stall -> SIGTERM to the job's tree, TERM_GRACE, SIGKILL
    classify(...)                             exit 0: done, the result from stdout;
                                              else memory_limit (an allocation failure on
                                              stderr) / exception / permanent / crashed /
                                              timeout

The decisions (``substitute``, ``result_of``, ``classify``, ``build_environment``) are pure
and table-tested (workers/command_rules.py, where ``CommandSpec`` lives too); this runner only
does I/O, and never raises: a failure of its own fails the job. The job's leftovers (a daemon
it started) are killed when the job ends (``workers.tree.end_all``).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from typing import Any

from workers import context, limits, protocol, tree
from workers.command_rules import (
    RESULT_TEXT,
    CommandSpec,
    Ending,
    MissingField,
    build_environment,
    classify,
    substitute,
)
from workers.outcome import Outcome

TERM_GRACE = 0.5  # seconds between SIGTERM and SIGKILL when a command is stopped
STDOUT_KEEP = 8 * 1024 * 1024  # stdout kept whole up to this, for JSON; past it only the tail
STDERR_KEEP = 64 * 1024  # bytes of stderr kept (its tail)
# where a job's folder is made: the worker's own directory (workers.scratch, set at the
# worker's start), which the supervisor removes when it reaps the worker; None: the default
# temp directory
FOLDER_ROOT: str | None = None


def runs_commands(handlers: Mapping[str, object]) -> bool:
    """Whether any of a pool's handlers is a command (only those jobs make folders)."""
    return any(isinstance(h, CommandHandler) for h in handlers.values())


class CommandHandler:
    """The callable a command kind resolves to (``workers.handlers``). ``run`` returns an
    ``Outcome`` and never raises; calling it like a Python handler returns the result or
    raises ``CommandError`` (tests, and code that calls handlers directly)."""

    def __init__(self, spec: CommandSpec) -> None:
        self.spec = spec

    def __repr__(self) -> str:
        return f"CommandHandler({list(self.spec.argv)!r})"

    def __call__(self, payload: Any) -> Any:
        outcome = self.run(payload)
        if outcome.error_kind is not None:
            raise CommandError(outcome.message)
        return outcome.result

    def run(self, payload: Any) -> Outcome:
        start = time.monotonic()
        try:
            argv = substitute(self.spec.argv, payload)
        except MissingField as exc:
            return Outcome(error_kind=protocol.PERMANENT, message=f"{exc}: not run")
        try:
            folder = tempfile.mkdtemp(prefix="fleetd-job-", dir=FOLDER_ROOT)
        except OSError as exc:
            where = FOLDER_ROOT or tempfile.gettempdir()
            message = f"cannot create the job's folder in {where}: {exc.strerror or exc}: not run"
            return Outcome(error_kind=protocol.EXCEPTION, message=message)
        try:
            outcome = _Run(self.spec, argv, payload, folder, start).run()
        except Exception as exc:  # the worker must live; the job fails
            outcome = Outcome(error_kind=protocol.EXCEPTION, message=_broke(self.spec, exc))
        finally:
            tree.end_all()  # anything it left running holds the folder open; reaped
            shutil.rmtree(folder, ignore_errors=True)
        outcome.duration = time.monotonic() - start
        return outcome


def _broke(spec: CommandSpec, exc: BaseException) -> str:
    """The message of a job whose runner failed (not the program): what failed, and why."""
    why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return f"running {spec.program!r} failed in the worker: {type(exc).__name__}: {why}"


class CommandError(Exception):
    """A command handler called directly (not by the runtime) failed."""


def job_environment(folder: str, extra: tuple[tuple[str, str], ...] = ()) -> dict[str, str]:
    """The program's environment for the current job (``build_environment``)."""
    try:
        job = context.current_job()
    except RuntimeError:
        return build_environment(os.environ, folder, {}, extra)
    named = {
        "FLEETD_JOB_ID": str(job.id),
        "FLEETD_JOB_KIND": job.kind,
        "FLEETD_JOB_ATTEMPT": str(job.attempt),
        "FLEETD_JOB_DEADLINE": f"{job.deadline:.3f}",
    }
    return build_environment(os.environ, folder, named, extra)


def _deadline(start: float) -> float:
    """The job's deadline on the monotonic clock (inf outside a job)."""
    try:
        job = context.current_job()
    except RuntimeError:
        return float("inf")
    return start + max(0.0, job.deadline - time.time())


def _in_child() -> None:
    """Between fork and exec: default SIGINT/SIGTERM (the worker ignores them, and an
    ignored signal stays ignored across exec, so SIGTERM could not stop the program), an
    empty signal mask, and death with the worker."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())
    limits.set_pdeathsig(signal.SIGKILL)


class _Run:
    """One command's I/O: feed stdin, collect stdout and stderr, stop it when due."""

    def __init__(
        self, spec: CommandSpec, argv: list[str], payload: Any, folder: str, start: float
    ) -> None:
        self.spec = spec
        self.argv = argv
        self.stdin = json.dumps(payload, allow_nan=False).encode()
        self.folder = folder
        self.start = start
        self.deadline = _deadline(start)
        self.out = bytearray()
        self.out_complete = True
        self.err = bytearray()
        self.last_output = start
        self.peak = 0

    def run(self) -> Outcome:
        try:
            proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=self.folder,
                env=job_environment(self.folder, self.spec.env),
                preexec_fn=_in_child,
                close_fds=True,
            )
        except OSError as exc:
            why = exc.strerror or str(exc)
            message = f"cannot start {self.spec.program!r}: {why}"
            return Outcome(error_kind=protocol.EXCEPTION, message=message)
        ending = self._communicate(proc)
        outcome = classify(self.spec, ending, bytes(self.out), self.out_complete, bytes(self.err))
        outcome.child_peak = self.peak
        return outcome

    def _communicate(self, proc: subprocess.Popen[bytes]) -> Ending:
        assert proc.stdin and proc.stdout and proc.stderr
        pidfd = os.pidfd_open(proc.pid)
        streams = {proc.stdout.fileno(): self.out, proc.stderr.fileno(): self.err}
        stdin_fd = proc.stdin.fileno()
        for fd in (*streams, stdin_fd):
            os.set_blocking(fd, False)
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        for fd in streams:
            poller.register(fd, select.POLLIN)
        poller.register(stdin_fd, select.POLLOUT)
        pending = memoryview(self.stdin)
        stopped_for: str | None = None
        try:
            while True:
                now = time.monotonic()
                stall_at = (
                    self.last_output + self.spec.stall_timeout
                    if self.spec.stall_timeout is not None
                    else float("inf")
                )
                if now >= self.deadline or now >= stall_at:
                    stopped_for = "timeout" if now >= self.deadline else "stall"
                    self._stop(proc.pid, pidfd)
                    break
                wait = min(self.deadline, stall_at) - now
                events = poller.poll(None if wait == float("inf") else max(1, wait * 1000 + 1))
                exited = False
                for fd, _ in events:
                    if fd == pidfd:
                        exited = True
                    elif fd == stdin_fd:
                        pending = self._feed(proc, pending, poller)
                    else:
                        if not self._read(fd, streams[fd]):
                            poller.unregister(fd)
                if exited:
                    for fd, buf in streams.items():  # what it wrote before it exited
                        self._read(fd, buf)
                    break
        finally:
            os.close(pidfd)
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                with contextlib.suppress(OSError):
                    stream.close()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = 0  # reaped here, with its rusage: Popen must not wait again
        self.peak = usage.ru_maxrss * 1024
        return Ending(status, stopped_for, time.monotonic() - self.start, self.spec.stall_timeout)

    def _feed(
        self, proc: subprocess.Popen[bytes], pending: memoryview, poller: select.poll
    ) -> memoryview:
        """Write what the pipe takes of the payload; close stdin once all is written (or the
        program closed its end: not reading its stdin is allowed)."""
        assert proc.stdin is not None
        try:
            pending = pending[os.write(proc.stdin.fileno(), pending) :]
        except BlockingIOError:
            return pending
        except OSError:  # EPIPE: it does not read its stdin
            pending = pending[len(pending) :]
        if not pending:
            poller.unregister(proc.stdin.fileno())
            with contextlib.suppress(OSError):
                proc.stdin.close()
        return pending

    def _read(self, fd: int, buf: bytearray) -> bool:
        """Read what is there; False at end of file."""
        while True:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                return True
            except OSError:
                return False
            if not data:
                return False
            self.last_output = time.monotonic()
            buf += data
            keep = STDOUT_KEEP if buf is self.out else STDERR_KEEP
            if len(buf) > keep:
                if buf is self.out:
                    self.out_complete = False
                del buf[: len(buf) - max(RESULT_TEXT, keep // 2)]

    def _stop(self, pid: int, pidfd: int) -> None:
        """SIGTERM to the program and everything the job started, TERM_GRACE for the program
        to exit, then SIGKILL to whatever is left."""
        tree.signal_all(tree.job_processes(), signal.SIGTERM)
        select.select([pidfd], [], [], TERM_GRACE)
        tree.signal_all([pid], signal.SIGKILL)
        tree.signal_all(tree.job_processes(), signal.SIGKILL)
