"""How a worker ended, and what that means for its job: the one place that interprets exit
statuses (``os.waitpid``) and kill reasons."""

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
    if reason is None and os.WIFSIGNALED(status) and os.WTERMSIG(status) == DEADLINE_SIGNAL:
        return ExitVerdict(
            "fail",
            ErrorKind.TIMEOUT,
            "ran past its timeout: ended by its worker's own deadline alarm (the supervisor's "
            "kill had not come)",
        )
    if reason is None:
        hint = ""
        if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
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
