"""A command handler's pure rules: its spec as configured (``CommandSpec``), argv from the
payload (``substitute``), the program's environment (``build_environment``) and what its end
means for the job (``classify``, ``result_of``). Values in, values out, table-tested; the
runner that does the I/O is workers/command.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from workers import protocol
from workers.outcome import Outcome

RESULT_TEXT = 4096  # bytes of stdout kept as the result when it is not JSON
STDERR_LINES = 10  # lines of stderr's tail in last_error
STDERR_CHARS = 1500  # ... at most this many characters of them
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
