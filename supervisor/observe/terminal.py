"""The interactive ``fleetd status``: the terminal I/O around the pure parts (keys.decode,
liveview.on_key, livescreen.draw). Thin on purpose: it reads keys, reads the fleet, performs
actions and redraws; every decision is in liveview.

- The terminal is in cbreak mode without echo only while the view runs, and is restored on
  every way out: q, an exception, Ctrl-C (SIGINT stays a KeyboardInterrupt: cbreak keeps the
  terminal's signal keys), SIGTERM and SIGHUP (turned into SystemExit while the view runs, so
  the restore in ``finally`` runs for them too; by default they would end the process with the
  terminal left without echo).
- One ``select`` waits on stdin and on the refresh timer together: a key is acted on and the
  frame redrawn at once (from the last read, or after a new read when the key changed
  something), and a refresh never waits for a key.
- A read that fails keeps the last frame on screen and says why on the status line; the next
  refresh tries again. Actions answer with a line (supervisor/livecontrols.py).

It runs in the ``status`` command only, which never forks and starts no thread (rich's
``Live`` with ``auto_refresh=False``).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import termios
import time
import tty
from collections.abc import Iterator
from dataclasses import replace
from types import FrameType
from typing import Protocol

from rich.console import Console
from rich.live import Live

from supervisor.errors import FleetdError
from supervisor.model import iso
from supervisor.observe import livescreen, liveview
from supervisor.observe.fleetview import FleetView
from supervisor.observe.keys import decode, unfinished

READ_SIZE = 1024  # bytes of keys taken in one read (a burst of held-down j is many)
# How long a read that ended inside an escape sequence waits for the rest (an arrow's bytes
# split by the network): also how long Escape alone takes to act. vim's ttimeoutlen is 100 ms.
ESC_WAIT = 0.1


class Source(Protocol):
    """Where the view reads and acts (supervisor.livecontrols.LiveControls)."""

    def view(self) -> FleetView: ...
    def dead_letters(
        self, pool: str, only: str, limit: int, now: float
    ) -> tuple[int, tuple[liveview.DeadRow, ...]]: ...
    def perform(self, action: liveview.Action) -> str: ...


def interactive(console: Console) -> bool:
    """Keys can be read: the output is a terminal and so is the input."""
    return console.is_terminal and sys.stdin.isatty()


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    # Not the supervisor's "a handler only records": this process has no loop to tell, and
    # raising is what makes the terminal's restore (a finally) run before the process ends.
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def keyboard(fd: int) -> Iterator[None]:
    """cbreak and no echo on ``fd`` while the block runs; the saved mode restored after it,
    however it ends."""
    saved = termios.tcgetattr(fd)
    previous = {sig: signal.signal(sig, _exit_on_signal) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        tty.setcbreak(fd, termios.TCSANOW)  # ICANON and ECHO off; ISIG (Ctrl-C) kept
        yield
    finally:
        with contextlib.suppress(termios.error):  # a hung-up terminal (SIGHUP) has no mode
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run(source: Source, console: Console, interval: float, fd: int | None = None) -> None:
    """The interactive view until q (or Esc on the main screen, Ctrl-C, SIGTERM, SIGHUP).
    The first read happens before the terminal changes: its error is the command's."""
    fd = sys.stdin.fileno() if fd is None else fd
    view = source.view()
    state = liveview.State()
    with keyboard(fd), Live(console=console, auto_refresh=False, transient=False) as live:
        due, reload = time.monotonic() + interval, False  # the view was just read
        while True:
            # the last line stays free: the newline after the frame would scroll it away
            width, height = console.size.width, console.size.height - 1
            if reload or time.monotonic() >= due:
                view, state = _refresh(source, view, state, height)
                due, reload = time.monotonic() + interval, False
            state = liveview.with_rows(state, livescreen.main_rows(state, view, width, height))
            live.update(livescreen.draw(state, view, width, height), refresh=True)
            if state.quit:
                return
            ready, _, _ = select.select([fd], [], [], max(0.0, due - time.monotonic()))
            if not ready:
                continue
            data = read_keys(fd, ESC_WAIT)
            if not data:  # the terminal is gone
                return
            state, reload = _keys(source, state, decode(data))


def read_keys(fd: int, wait: float) -> bytes:
    """What is waiting on ``fd`` (at least one byte; none: the terminal is gone). A read that
    ends inside an escape sequence waits up to ``wait`` seconds for the rest, so an arrow
    split across reads is not taken for Escape (which quits) and two letters."""
    data = os.read(fd, READ_SIZE)
    while data and unfinished(data) and select.select([fd], [], [], wait)[0]:
        more = os.read(fd, READ_SIZE)
        if not more:
            break
        data += more
    return data


def _keys(source: Source, state: liveview.State, keys: list[str]) -> tuple[liveview.State, bool]:
    """Apply keys in order; perform what they ask. True when the fleet should be read again
    (something was written, or the screen needs other rows)."""
    reload = False
    for key in keys:
        state, action = liveview.on_key(state, key)
        if isinstance(action, liveview.WRITES):
            state = liveview.on_done(state, source.perform(action))
        reload = reload or action is not None
        if state.quit:
            break
    return state, reload


def _refresh(
    source: Source, view: FleetView, state: liveview.State, height: int
) -> tuple[FleetView, liveview.State]:
    """Read the fleet (and the open dead letters); on a store error keep the last view."""
    try:
        view = source.view()
        if state.dead_pool is not None:
            limit = livescreen.dead_room(height)
            count, dead = source.dead_letters(state.dead_pool, state.filter, limit, view.taken_at)
            state = liveview.with_dead(state, dead, count)
    except FleetdError as exc:
        when = (iso(view.taken_at) or "")[11:19]
        return view, replace(state, trouble=f"could not read the fleet: {exc} (frame of {when}Z)")
    return view, replace(state, trouble="")
