"""The worker's deadline alarm (workers/limits.py): a POSIX timer of its own that ends the
process, whatever the handler does with SIGALRM or setitimer."""

from __future__ import annotations

import os
import signal
import time

from workers.limits import DEADLINE_SIGNAL, DeadlineAlarm


def run_in_child(body) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            body()
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return status


def test_an_armed_alarm_ends_the_process_even_if_the_handler_owns_sigalrm() -> None:
    def body() -> None:
        alarm = DeadlineAlarm()
        alarm.arm(0.2)
        signal.signal(signal.SIGALRM, lambda *_: None)  # a handler's own alarm use
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        time.sleep(5)

    status = run_in_child(body)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == DEADLINE_SIGNAL


def test_a_disarmed_alarm_never_fires() -> None:
    def body() -> None:
        alarm = DeadlineAlarm()
        alarm.arm(0.1)
        alarm.arm(0)
        time.sleep(0.3)

    status = run_in_child(body)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_arm_between_keeps_an_armed_time_inside_its_window() -> None:
    """Short jobs re-arm the alarm once a window, not once a job: a time already armed inside
    [seconds, seconds + slack] from now is kept; one outside it, or none, is armed again."""
    alarm = DeadlineAlarm()
    try:
        alarm.arm_between(30.0, 5.0)
        first = alarm.fires_at
        assert first is not None and time.monotonic() + 34.0 < first <= time.monotonic() + 35.0
        alarm.arm_between(30.0, 5.0)
        assert alarm.fires_at == first  # still inside the window: no system call
        alarm.arm_between(20.0, 5.0)  # armed past this window's end: armed again
        assert alarm.fires_at is not None and alarm.fires_at < first
        alarm.arm_between(40.0, 5.0)  # armed before this window's start: armed again
        assert alarm.fires_at is not None and alarm.fires_at > first
        alarm.arm(0)
        assert alarm.fires_at is None
        alarm.arm_between(30.0, 5.0)
        assert alarm.fires_at is not None
    finally:
        alarm.arm(0)


def test_an_alarm_kept_by_arm_between_still_fires() -> None:
    def body() -> None:
        alarm = DeadlineAlarm()
        alarm.arm_between(0.1, 0.1)
        alarm.arm_between(0.1, 0.1)  # kept
        time.sleep(5)

    status = run_in_child(body)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == DEADLINE_SIGNAL
