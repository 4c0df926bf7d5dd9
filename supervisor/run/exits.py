"""How a worker ended, and what that means for its job: the one place on the parent's side that
interprets exit statuses (``os.waitpid``, ``os.waitid``) and kill reasons.

The child side decodes statuses of its own: workers/forker.py (the forker relays the exits it
reaps as wait statuses) and workers/command.py (a command handler's program). They run in
processes that never import ``supervisor``, so they cannot call these functions.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

from supervisor.model import ErrorKind
from supervisor.policy import KillKind, KillReason
from workers import exitcodes
from workers.limits import DEADLINE_SIGNAL


@dataclass(frozen=True, slots=True)
class ExitVerdict:
    """What a worker's end means for the job it was running."""

    # "fail": record a failure; "release": hand back; "forget": lease not ours; "cancel": an
    # operator cancelled it (the store makes the delivery's end cancelled, counted)
    action: str
    error_kind: ErrorKind | None
    message: str


def exit_code(status: int) -> int | None:
    """The code a process exited with, from its wait status; None if a signal ended it."""
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else None


def waitid_exit_code(info: os.waitid_result) -> int | None:
    """``exit_code`` of an ``os.waitid`` record: None unless the child exited itself."""
    return info.si_status if info.si_code == os.CLD_EXITED else None


def killed_by(status: int, signum: int) -> bool:
    """Whether the wait status says signal ``signum`` ended the process."""
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signum


def describe_status(status: int) -> str:
    """``exited with code 3`` or ``killed by SIGSEGV``."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return f"killed by {name}"
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else status
    known = exitcodes.name(code)
    return f"exited with code {code}" + (f" ({known})" if known else "")


def classify_exit(status: int, reason: KillReason | None) -> ExitVerdict:
    """How a worker that was running a job ended: the parent's kill reason wins (it knows
    why it killed), otherwise the worker crashed on its own, whatever its exit code."""
    how = describe_status(status)
    if reason is None and killed_by(status, DEADLINE_SIGNAL):
        return ExitVerdict(
            "fail",
            ErrorKind.TIMEOUT,
            "ran past its timeout: ended by its worker's own deadline alarm (the supervisor's "
            "kill had not come)",
        )
    if reason is None:
        hint = ""
        if killed_by(status, signal.SIGKILL):
            hint = " (not by fleetd: the kernel's OOM killer or an operator?)"
        return ExitVerdict("fail", ErrorKind.CRASHED, f"worker {how}{hint}")
    if reason.kind == KillKind.MEMORY_LIMIT:
        return ExitVerdict("fail", ErrorKind.MEMORY_LIMIT, reason.detail)
    if reason.kind == KillKind.TIMEOUT:
        return ExitVerdict("fail", ErrorKind.TIMEOUT, reason.detail)
    if reason.kind == KillKind.CANCEL:
        return ExitVerdict("cancel", None, reason.detail)
    if reason.kind == KillKind.LEASE_LOST:
        return ExitVerdict("forget", None, reason.detail)
    return ExitVerdict("release", None, reason.detail or f"worker stopped ({reason.kind})")


RELEASED = ExitVerdict("release", None, "")


def job_verdicts(
    status: int,
    reason: KillReason | None,
    target: int | None,
    running: dict[int, float],
    now: float,
) -> dict[int, ExitVerdict]:
    """What a worker's end means for each job it was running (``running``: job id ->
    monotonic deadline). Pure: the table in tests/unit/test_exits.py.

    - A kill is about one job (``target``): that job gets ``classify_exit``'s verdict
      (timeout, memory_limit, cancel, forget, release); every other job is released, its
      delivery not counted: it did nothing wrong (a thread cannot be killed alone, so a
      worker with slots ends whole for one job).
    - The deadline alarm (no kill booked): the jobs past their deadline fail ``timeout``,
      the others are released; if none is past it (clocks), the one due first is blamed.
    - A crash (no kill booked; a segfault, an exit, a SIGKILL not by fleetd): one job is
      blamed as always. With several, none can be singled out, and releasing them all would
      let a poison job crash worker after worker forever. So every one of them fails
      ``crashed`` and is charged the delivery: a poison job is dead-lettered after
      ``max_deliveries`` as in a one-slot pool; its siblings each spend one delivery, and
      retry with backoff, away from it.
    """
    if not running:
        return {}
    if reason is not None:
        verdict = classify_exit(status, reason)
        return {job: verdict if job == target else RELEASED for job in running}
    alone = classify_exit(status, None)
    if alone.error_kind is ErrorKind.TIMEOUT:  # the deadline alarm
        past = {job for job, deadline in running.items() if deadline <= now}
        if not past:
            past = {min(running, key=running.__getitem__)}
        return {job: alone if job in past else RELEASED for job in running}
    if len(running) == 1:
        return {job: alone for job in running}
    shared = ExitVerdict(
        "fail",
        ErrorKind.CRASHED,
        f"{alone.message}, running {len(running)} jobs in its slots: none can be singled "
        "out, each is charged the delivery",
    )
    return {job: shared for job in running}
