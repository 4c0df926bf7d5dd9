"""The keys of ``fleetd status`` in a real terminal (a tmux pane at 80×24, and 160×48),
against a real supervisor, on SQLite and PostgreSQL (issue 15's "Show"):

- the first pool is selected when the view opens; ``p`` pauses it fleet-wide (``fleetd status
  --json`` says paused) and ``p`` again resumes it;
- ``c`` asks (``cancel job N (sleep, tenant acme, running …s on HOST)? y/n``) and ``y``
  cancels the selected running ``sleep`` job: it ends ``cancelled``;
- ``d`` opens the pool's dead letters and ``r`` requeues the selected one: it runs again and
  ends done (its fault was fixed meanwhile);
- ``?`` shows the keys; ``q`` quits and leaves the terminal as it was (echo and line editing
  back: a line typed at the shell afterwards is echoed and read whole).

The view runs with ``--interval 60``: no refresh happens during the test, so every change on
screen after a key was drawn by that key (a key acts within the frame, not at the next
refresh). Every wait reads the pane or the store until the text appears, with a deadline.

With ``FLEETD_WRITE_STATUS_DOCS=1`` the frame with the cancel question is written to
docs/status-keys-80x24.txt (the screenshot docs/observability.md shows).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psutil
import pytest
from click.testing import CliRunner

from supervisor.cli import main
from supervisor.model import JobState
from supervisor.store import open_store
from tests.integration.fleet import REPO, Harness, Supervisor, handlers
from tests.support.databases import postgres_schema_url
from tests.support.tcpproxy import TcpProxy
from tests.support.wait import eventually

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux"),
]

POOLS: dict[str, dict[str, Any]] = {
    "work": {
        "handlers": handlers("sleep", "fail_while"),
        "bound": "io",
        "min_workers": 2,
        "max_workers": 2,
        "prefetch": 0,
        "max_deliveries": 1,
        "timeout": "1h",
    },
    "spare": {"handlers": handlers("echo"), "bound": "io", "min_workers": 1, "max_workers": 1},
}
REVERSE = re.compile(r"\x1b\[(?:[0-9]*;)*7(?:;[0-9]*)*m")  # an SGR that turns reverse video on


class Pane:
    """A detached tmux session of its own server, running one shell command."""

    def __init__(self, command: str, width: int, height: int) -> None:
        self.tmux = ["tmux", "-L", f"fleetd-keys-{uuid.uuid4().hex[:8]}"]
        env = {k: v for k, v in os.environ.items() if k not in ("TMUX", "COLUMNS", "LINES")}
        size = ["-x", str(width), "-y", str(height)]
        subprocess.run(
            [*self.tmux, "new-session", "-d", "-s", "t", *size, command], check=True, env=env
        )

    def text(self, escapes: bool = False) -> str:
        """The screen now (with ``escapes``: its colours and attributes as SGR sequences)."""
        out = subprocess.run(
            [*self.tmux, "capture-pane", "-p", *(["-e"] if escapes else []), "-t", "t"],
            check=True,
            capture_output=True,
        )
        return out.stdout.decode()

    def lines(self) -> list[str]:
        return [line for line in self.text().splitlines() if line.strip()]

    def send(self, *keys: str, literal: bool = True) -> None:
        flag = ["-l"] if literal else []
        for key in keys:
            subprocess.run([*self.tmux, "send-keys", "-t", "t", *flag, key], check=True)

    def wait_for(self, needle: str, timeout: float = 15.0) -> str:
        """Until ``needle`` is on screen; the screen then."""

        def seen() -> str | None:
            screen = self.text()
            return screen if needle in screen else None

        try:
            return eventually(seen, timeout=timeout)
        except AssertionError:
            raise AssertionError(f"{needle!r} not on screen:\n{self.text()}") from None

    def status_line(self) -> str:
        """The line above the footer (the frame is drawn from the top of the pane)."""
        lines = self.lines()
        footer = next(i for i, line in enumerate(lines) if line.startswith("↑↓/jk select"))
        return lines[footer - 1]

    def close(self) -> None:
        subprocess.run([*self.tmux, "kill-server"], check=False, capture_output=True)


def status_command(config: Path) -> str:
    """The view, then (once it quit) what the terminal is like, in one line: ``EXITED=0
    flags: icanon echo .`` (the exit status; the stty flags, ``-echo`` if echo were off);
    then a line read by the shell (echoed by the terminal only if echo is back on)."""
    flags = "stty -a | tr ' ' '\\n' | grep -x -- '-\\?\\(icanon\\|echo\\)' | tr '\\n' ' '"
    return (
        f"cd {REPO} && env -u COLUMNS -u LINES {sys.executable} -m supervisor status "
        f'-c {config} --interval 60; rc=$?; echo "EXITED=$rc flags: $({flags})."; '
        'read line; echo "read:$line"; sleep 600'
    )


def exited(pane: Pane) -> tuple[int, list[str]]:
    """Until the view quit: its exit status and the terminal's flags then."""

    def said() -> re.Match[str] | None:
        return re.search(r"EXITED=(\d+) flags: ([^.]*)\.", pane.text())

    try:
        found = eventually(said, timeout=15)
    except AssertionError:
        raise AssertionError(f"the view did not quit:\n{pane.text()}") from None
    return int(found[1]), found[2].split()


def json_pools(config: Path) -> dict[str, Any]:
    import json

    out = CliRunner().invoke(main, ["status", "-c", str(config), "--json"])
    assert out.exit_code == 0, out.output
    return json.loads(out.output)["pools"]


def running_job(sup: Supervisor, fleet: Harness, job_id: int) -> str:
    """Until the published snapshot shows ``job_id`` running; the worker's name."""

    def busy() -> str | None:
        sup.check_alive()
        for w in sup.workers(fleet.store, "work"):
            if w["job"] == job_id and w["state"] == "busy":
                return f"work#{w['slot']}"
        return None

    return eventually(busy, timeout=20)


def test_keys_pause_cancel_and_requeue_in_a_real_terminal(fleet: Harness, tmp_path: Path) -> None:
    config = fleet.configure(POOLS)
    sup = fleet.start()
    sup.wait_workers(fleet.store, "work", 2)
    flag = tmp_path / "fault"
    flag.write_text("the downstream is down")
    dead = fleet.enqueue("fail_while", {"flag": str(flag)})
    fleet.wait_state([dead], JobState.DEAD)
    hang = fleet.enqueue("sleep", {"seconds": 1000}, tenant="acme")
    running_job(sup, fleet, hang)

    pane = Pane(status_command(config), 80, 24)
    try:
        pane.wait_for("pool work: p pauses it, d opens its dead letters")
        assert f" {hang} " in pane.text()  # the running job is on screen (the view's one read)
        selected = [line for line in pane.text(escapes=True).splitlines() if REVERSE.search(line)]
        assert len(selected) == 1 and "work" in selected[0], selected  # the first pool
        assert all(len(line) <= 80 for line in pane.lines())

        # p: paused fleet-wide, as fleetd status --json says; p again: resumed
        pane.send("p")
        pane.wait_for("paused pool work fleet-wide (running jobs finish) — p again to resume")
        pane.wait_for("PAUSED")
        assert json_pools(config)["work"]["paused"] is True
        pane.send("p")
        pane.wait_for("resumed pool work (paused since")
        assert json_pools(config)["work"]["paused"] is False

        # c on the running job: a question, then y cancels it
        pane.send("G")  # the last row: the one running job
        pane.wait_for(f"job {hang} (sleep on ")
        pane.send("c")
        question = pane.wait_for("? y/n")
        assert re.search(
            rf"cancel job {hang} \(sleep, tenant acme, running \d+s on \S+\)\? y/n", question
        ), question
        assert fleet.job(hang).state is JobState.LEASED  # asking did nothing yet
        if os.environ.get("FLEETD_WRITE_STATUS_DOCS") and "sqlite" in fleet.database:
            (REPO / "docs" / "status-keys-80x24.txt").write_text(question.rstrip() + "\n")
        pane.send("y")
        pane.wait_for(f"job {hang}: cancel requested: node-a stops it within a second")
        eventually(lambda: fleet.job(hang).state is JobState.CANCELLED, timeout=10)

        # d opens the dead letters of the pool; r requeues the selected one, which runs again
        flag.unlink()  # the fault is fixed
        pane.send("g", "d")
        pane.wait_for("dead letters of pool work: 1, oldest first")
        pane.wait_for(f"dead job {dead} (fail_while): r requeues it, x purges it")
        pane.send("r")
        pane.wait_for(f"requeued 1 job(s): {dead} — queued again")
        pane.wait_for("dead letters of pool work: 0")  # drawn by the same key's read
        ran = fleet.wait_final([dead])[0]
        assert ran.state is JobState.DONE and ran.result == "fixed"
        assert len(fleet.executions(dead)) == 2  # died once, ran again once

        # ? shows the keys; Esc closes them, Esc leaves the dead letters, q quits
        pane.send("?")
        pane.wait_for("keys of fleetd status")
        assert "requeue the selected dead letter" in pane.text()
        pane.send("Escape", literal=False)
        pane.wait_for("↑↓/jk select  r requeue  x purge")
        pane.send("Escape", literal=False)
        pane.wait_for("↑↓/jk select  p pause  c cancel")
        pane.send("q")
        assert exited(pane) == (0, ["icanon", "echo"])  # not -icanon, not -echo
        pane.send("still sane", "\r")
        screen = pane.wait_for("read:still sane")
        assert "\nstill sane\n" in screen  # the typed line was echoed by the terminal
    finally:
        pane.close()


@pytest.mark.parametrize("engine", ["sqlite"])
def test_the_wide_view_takes_the_same_keys(fleet: Harness) -> None:
    config = fleet.configure(POOLS)
    sup = fleet.start()
    sup.wait_workers(fleet.store, "work", 2)
    pane = Pane(status_command(config), 160, 48)
    try:
        pane.wait_for("pool work: p pauses it, d opens its dead letters")
        lines = pane.lines()
        assert lines[-1].startswith("↑↓/jk select  p pause") and all(len(x) <= 160 for x in lines)
        assert any(line.startswith("pool ") and "workers" in line for line in lines)  # the table
        selected = [line for line in pane.text(escapes=True).splitlines() if REVERSE.search(line)]
        assert len(selected) == 1 and "work" in selected[0], selected
        pane.send("j")
        pane.wait_for("pool spare: p pauses it")
        pane.send("p")
        pane.wait_for("paused pool spare fleet-wide")
        assert json_pools(config)["spare"]["paused"] is True
        pane.send("p")
        pane.wait_for("resumed pool spare")
        assert json_pools(config)["spare"]["paused"] is False
        pane.send("Escape", literal=False)  # Esc on the main screen quits
        assert exited(pane) == (0, ["icanon", "echo"])
    finally:
        pane.close()


def view_process(pane: Pane) -> psutil.Process:
    """The ``fleetd status`` process in the pane (a child of its shell)."""
    out = subprocess.run(
        [*pane.tmux, "display-message", "-p", "-t", "t", "#{pane_pid}"],
        check=True,
        capture_output=True,
    )
    shell = psutil.Process(int(out.stdout))

    def find() -> psutil.Process | None:
        for child in shell.children(recursive=True):
            if "status" in child.cmdline():
                return child
        return None

    return eventually(find, timeout=10)


@pytest.mark.parametrize("engine", ["sqlite"])
@pytest.mark.parametrize(("how", "status"), [("ctrl-c", 0), ("sigterm", 128 + signal.SIGTERM)])
def test_ctrl_c_and_sigterm_leave_the_terminal_sane(fleet: Harness, how: str, status: int) -> None:
    config = fleet.configure(POOLS)
    fleet.start()
    pane = Pane(status_command(config), 80, 24)
    try:
        pane.wait_for("pool work: p pauses it")
        pane.send("j")  # the view is in cbreak mode: the key is taken at once, not echoed
        pane.wait_for("pool spare: p pauses it")
        if how == "ctrl-c":
            pane.send("C-c", literal=False)
        else:
            view_process(pane).terminate()
        assert exited(pane) == (status, ["icanon", "echo"])
        pane.send("typed after", "\r")
        assert "\ntyped after\n" in pane.wait_for("read:typed after")
    finally:
        pane.close()


@pytest.fixture
def proxied_fleet(tmp_path: Path, start_supervisor: Any) -> Iterator[tuple[Harness, TcpProxy]]:
    """A fleet whose config reaches PostgreSQL through a proxy the test can cut; the test's
    own store connects directly."""
    proxy = TcpProxy("127.0.0.1", 5432)
    try:
        with postgres_schema_url() as url:
            parts = urlsplit(url)
            user = f"{parts.username}@" if parts.username else ""
            proxied = urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{proxy.port}"))
            store = open_store(url)
            try:
                yield Harness(tmp_path, proxied, store, start_supervisor), proxy
            finally:
                store.close()
    finally:
        proxy.close()


@pytest.mark.postgres
def test_a_database_error_is_a_line_on_the_screen_not_a_crash(
    proxied_fleet: tuple[Harness, TcpProxy],
) -> None:
    fleet, proxy = proxied_fleet
    config = fleet.configure(POOLS)
    fleet.start()
    pane = Pane(status_command(config), 80, 24)
    try:
        pane.wait_for("pool work: p pauses it")
        proxy.cut()  # every connection of the view (and the supervisor) dropped, none accepted
        pane.send("p")
        pane.wait_for("could not pause pool work: ")
        pane.send("j")  # the action's line goes with the next key; the failed read's stays
        pane.wait_for("could not read the fleet: ")
        assert fleet.store.pauses() == []
        proxy.restore()
        pane.send("k", "p")
        pane.wait_for("paused pool work fleet-wide")
        assert [p.pool for p in fleet.store.pauses()] == ["work"]
        pane.send("q")
        assert exited(pane) == (0, ["icanon", "echo"])
    finally:
        pane.close()
