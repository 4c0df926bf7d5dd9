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
