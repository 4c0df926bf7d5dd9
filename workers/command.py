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
and table-tested; the runner only does I/O, and never raises: a failure of its own fails the
job. The job's leftovers (a daemon it started) are killed when the job ends
(``workers.tree.end_all``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from workers import context, limits, protocol, tree
from workers.outcome import Outcome

TERM_GRACE = 0.5  # seconds between SIGTERM and SIGKILL when a command is stopped
RESULT_TEXT = 4096  # bytes of stdout kept as the result when it is not JSON
STDOUT_KEEP = 8 * 1024 * 1024  # stdout kept whole up to this, for JSON; past it only the tail
STDERR_KEEP = 64 * 1024  # bytes of stderr kept (its tail)
STDERR_LINES = 10  # lines of stderr's tail in last_error
STDERR_CHARS = 1500  # ... at most this many characters of them
# where a job's folder is made: the worker's own directory (workers.scratch, set at the
# worker's start), which the supervisor removes when it reaps the worker; None: the default
# temp directory
FOLDER_ROOT: str | None = None
# what a program says on stderr when an allocation failed (RLIMIT_DATA, the cgroup's limit):
# Python, C (strerror ENOMEM), C++, and most runtimes and libraries
OUT_OF_MEMORY = re.compile(
    r"MemoryError|Cannot allocate memory|std::bad_alloc|out of memory", re.IGNORECASE
)
MEMORY_SIGNALS = frozenset({signal.SIGABRT, signal.SIGSEGV})  # a failed malloc, unchecked
# ``{name}`` a payload field; ``{{`` and ``}}`` a literal brace (``["awk", "{{print $1}}"]``)
PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True, slots=True)
class CommandSpec:
    """A command handler as configured: ``argv`` with ``{name}`` placeholders, the stall
    timeout in seconds (None: none), the exit codes that dead-letter at once and the
    variables it sets in the program's environment."""

    argv: tuple[str, ...]
    stall_timeout: float | None = None
    permanent_codes: frozenset[int] = frozenset()
    env: tuple[tuple[str, str], ...] = ()  # the handler's own ``env = { NAME = "value" }``

    def __post_init__(self) -> None:
        if not self.argv or not all(isinstance(a, str) for a in self.argv) or not self.argv[0]:
            raise ValueError(f"a command needs a program and string arguments: {self.argv!r}")

    @property
    def program(self) -> str:
        return self.argv[0]

    def placeholders(self) -> list[str]:
        """The payload fields the command names, in order, once each."""
        names: list[str] = []
        for arg in self.argv:
            names += [n for n in placeholder_names(arg) if n not in names]
        return names


def placeholder_names(arg: str) -> list[str]:
    """The ``{name}`` placeholders of one argument (``{{`` and ``}}`` are literal braces).

    >>> placeholder_names("{{x}} {y}-{z}")
    ['y', 'z']
    """
    return [m[1] for m in PLACEHOLDER.finditer(arg) if m[1]]


class MissingField(Exception):
    """A placeholder names a payload field that is missing or not a string or number, or
    whose value would be read as an option (``OptionField``)."""


class OptionField(MissingField):
    """A payload value that would start an argument with ``-`` (an option) before ``--``."""


def substitute(argv: tuple[str, ...], payload: Any) -> list[str]:
    """``argv`` with each ``{name}`` replaced by the payload's top-level field ``name`` (a
    string or a number), and ``{{`` / ``}}`` by ``{`` / ``}``. Raises MissingField naming
    the field and why; OptionField when a payload value would make an argument start with
    ``-`` (an option: ``-opw=x``) and no argument before it is exactly ``--``. An argument
    that starts with ``-`` in the config (``--page={n}``) is an option by design.

    >>> substitute(("convert", "{src}", "out-{n}.png"), {"src": "a.pdf", "n": 3})
    ['convert', 'a.pdf', 'out-3.png']
    >>> substitute(("awk", "{{print}}", "--", "{f}"), {"f": "-in"})
    ['awk', '{print}', '--', '-in']
    """

    def value(match: re.Match[str]) -> str:
        if match[0] == "{{":
            return "{"
        if match[0] == "}}":
            return "}"
        name = match[1]
        if not isinstance(payload, Mapping):
            raise MissingField(f"the payload is not a JSON object, so it has no field {name!r}")
        if name not in payload:
            raise MissingField(
                f"the payload has no field {name!r} (the command uses {{{name}}}; "
                f"write {{{{{name}}}}} for a literal {{{name}}})"
            )
        field = payload[name]
        if isinstance(field, bool) or not isinstance(field, str | int | float):
            kind = "null" if field is None else type(field).__name__
            raise MissingField(
                f"the payload's field {name!r} is a {kind} (expected a string or a number)"
            )
        if isinstance(field, str) and "\0" in field:
            raise MissingField(f"the payload's field {name!r} contains a NUL byte")
        return str(field)

    out: list[str] = []
    for arg in argv:
        text = PLACEHOLDER.sub(value, arg)
        if text.startswith("-") and not arg.startswith("-") and "--" not in out:
            names = ", ".join(map(repr, placeholder_names(arg)))
            raise OptionField(
                f"the payload's field {names} makes the argument {text[:80]!r}, which starts "
                f"with '-' and would be read as an option (put \"--\" before it in the command)"
            )
        out.append(text)
    return out


def result_of(stdout: bytes, complete: bool, code: int = 0) -> dict[str, Any]:
    """The result of a command that exited 0: ``{"exit_code": 0, "json": value}`` when stdout
    is one JSON value, else ``{"exit_code": 0, "text": its last 4 KiB}``. ``complete`` is
    False when stdout was longer than what was kept (then it is only text)."""
    if complete and stdout.strip():
        try:
            return {"exit_code": code, "json": json.loads(stdout, parse_constant=_no_constant)}
        except (ValueError, RecursionError):
            pass
    return {"exit_code": code, "text": stdout[-RESULT_TEXT:].decode("utf-8", "replace")}


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON a database can store")


def stderr_tail(stderr: bytes) -> str:
    """The last lines of stderr on one line (`` | `` between them), for ``last_error``."""
    lines = [line.strip() for line in stderr.decode("utf-8", "replace").splitlines()]
    text = " | ".join([line for line in lines if line][-STDERR_LINES:])
    return text[-STDERR_CHARS:]


@dataclass(frozen=True, slots=True)
class Ending:
    """How a command ended: its wait status (None if it could not be started), and why the
    runner stopped it, if it did ("timeout" or "stall")."""

    status: int | None
    stopped_for: str | None = None
    duration: float = 0.0
    stall_timeout: float | None = None


def classify(
    spec: CommandSpec, ending: Ending, stdout: bytes, complete: bool, stderr: bytes
) -> Outcome:
    """A finished command -> the job's outcome (pure). The runner's own stop wins: timeout or
    stall are ``timeout``; then exit 0 is done; a non-zero exit or SIGABRT/SIGSEGV with an
    allocation failure in stderr's tail (``OUT_OF_MEMORY``) is ``memory_limit`` (the
    program hit RLIMIT_DATA at once, before the watchdog could see it); then a code in
    ``permanent_codes`` is ``permanent``, another code ``exception``, a signal ``crashed``."""
    prog = os.path.basename(spec.program)
    tail = stderr_tail(stderr)
    said = f"; stderr: {tail}" if tail else "; no stderr"
    if ending.stopped_for == "timeout":
        message = f"{prog} ran past its timeout ({ending.duration:.1f}s): stopped{said}"
        return Outcome(error_kind=protocol.TIMEOUT, message=message, tail=tail)
    if ending.stopped_for == "stall":
        stall = ending.stall_timeout or 0.0
        message = (
            f"{prog} wrote nothing to stdout or stderr for {stall:g}s (stall_timeout): "
            f"stopped{said}"
        )
        return Outcome(error_kind=protocol.TIMEOUT, message=message, tail=tail)
    status = ending.status if ending.status is not None else 0
    memory = OUT_OF_MEMORY.search(tail)
    if memory and (
        (os.WIFSIGNALED(status) and os.WTERMSIG(status) in MEMORY_SIGNALS)
        or (os.WIFEXITED(status) and os.WEXITSTATUS(status) != 0)
    ):
        how = (
            f"was killed by {signal.Signals(os.WTERMSIG(status)).name}"
            if os.WIFSIGNALED(status)
            else f"exited with code {os.WEXITSTATUS(status)}"
        )
        message = f"{prog} {how} after an allocation failed ({memory[0]!r} on stderr){said}"
        return Outcome(error_kind=protocol.MEMORY_LIMIT, message=message, tail=tail)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return Outcome(error_kind=protocol.CRASHED, message=f"{prog} was killed by {name}{said}")
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else status
    if code == 0:
        return Outcome(result=result_of(stdout, complete, 0))
    if code in spec.permanent_codes:
        message = f"{prog} exited with code {code} (a permanent code: not retried){said}"
        return Outcome(error_kind=protocol.PERMANENT, message=message, tail=tail)
    message = f"{prog} exited with code {code}{said}"
    return Outcome(error_kind=protocol.EXCEPTION, message=message, tail=tail)


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


# what the program inherits from the worker's environment; nothing else (a secret the
# supervisor was given, such as a database password, never reaches a job's program)
PASSED_ENV = ("PATH", "LANG", "TZ")
PASSED_ENV_PREFIXES = ("LC_", "FLEETD_JOB_")


def build_environment(
    base: Mapping[str, str],
    folder: str,
    job: Mapping[str, str],
    extra: tuple[tuple[str, str], ...] = (),
) -> dict[str, str]:
    """The program's environment (pure): from ``base`` only PATH, LANG, TZ, LC_* and
    FLEETD_JOB_*; the job's folder as HOME and TMPDIR; ``job`` (FLEETD_JOB_* values); then
    the handler's own ``extra`` variables, which win.

    >>> build_environment({"PATH": "/bin", "DB_PASSWORD": "x"}, "/t", {}, (("A", "1"),))
    {'PATH': '/bin', 'HOME': '/t', 'TMPDIR': '/t', 'TMP': '/t', 'TEMP': '/t', 'A': '1'}
    """
    env = {
        name: value
        for name, value in base.items()
        if name in PASSED_ENV or name.startswith(PASSED_ENV_PREFIXES)
    }
    env.update(HOME=folder, TMPDIR=folder, TMP=folder, TEMP=folder)
    env.update(job)
    env.update(extra)
    return env


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
