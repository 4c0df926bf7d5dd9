"""The interactive ``fleetd status`` without a terminal: key decoding, what each key does on
each screen (tables of state + key -> state + action), how the selection survives refreshes,
and the frame it draws (captured with a recording console at 80×24 and 160×48)."""

from __future__ import annotations

import doctest
import fcntl
import io
import os
import re
import struct
import termios
import threading
import tty
from dataclasses import replace
from typing import Any

import pytest
from rich.console import Console

import supervisor.actions
from supervisor.model import CancelOutcome, ErrorKind, Job, JobState, Pause
from supervisor.observe import keys, livescreen, liveview, terminal
from supervisor.observe.liveview import (
    Cancel,
    DeadRow,
    Mode,
    Purge,
    Reload,
    Requeue,
    Resume,
    Row,
    State,
    on_key,
    with_dead,
    with_rows,
)
from supervisor.observe.liveview import Pause as PauseAction
from tests.support.wait import eventually
from tests.unit.test_observe import busy_fleet, pool, row, snapshot, view, worker


@pytest.mark.parametrize("module", [keys, liveview, supervisor.actions], ids=lambda m: m.__name__)
def test_doctests_pass(module: Any) -> None:
    result = doctest.testmod(module)
    assert result.attempted and not result.failed


# ---- keys -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "names"),
    [
        (b"j", ["j"]),
        (b"jjk", ["j", "j", "k"]),
        (b"\x1b[A", ["up"]),
        (b"\x1b[B\x1b[B", ["down", "down"]),
        (b"\x1bOA\x1bOB", ["up", "down"]),  # application cursor mode
        (b"\x1b[1;5A", ["up"]),  # Ctrl-Up: read as up
        (b"\x1b[5~\x1b[6~", ["pgup", "pgdn"]),
        (b"\x1b[H\x1b[F\x1b[1~\x1b[4~", ["home", "end", "home", "end"]),
        (b"\x1b", ["esc"]),
        (b"\x1b\x1b", ["esc", "esc"]),
        (b"\x1bq", ["esc", "q"]),
        (b"\r", ["enter"]),
        (b"\n", ["enter"]),
        (b"\x7f\x08", ["backspace", "backspace"]),
        (b"\x03", ["ctrl-c"]),
        (b"\x01", []),  # other control characters: nothing
        (b"/r\xc3\xa9", ["/", "r", "é"]),  # UTF-8 typed into the filter
        (b"\x1b[", []),  # a sequence cut short by the read: dropped
        (b"\x1b[Z", []),  # Shift-Tab and other unknown sequences: dropped
        (b"?", ["?"]),
    ],
)
def test_terminal_bytes_become_key_names(data: bytes, names: list[str]) -> None:
    assert keys.decode(data) == names


# ---- a screen of rows ---------------------------------------------------------------------------

ROWS = (
    Row("bulk"),
    Row("poison", paused=True),
    Row("bulk", 812, "render", "acme", 190.0, "host-a"),
    Row("poison", 900, "parse", None, 5.0, "host-b"),
)
DEAD = (
    DeadRow(17, "render", "acme", "memory_limit", 3, 200.0, "killed at 512M"),
    DeadRow(18, "render", None, "exception", 3, 20.0, "boom"),
    DeadRow(25, "parse", "zeta", "permanent", 1, 5.0, None),
)

MAIN = with_rows(State(), ROWS)
ON_JOB = replace(MAIN, selected=("bulk", 812))
ON_PAUSED = replace(MAIN, selected=("poison", None))
DEAD_OPEN = with_dead(replace(MAIN, mode=Mode.DEAD, dead_pool="bulk"), DEAD, 40)


def _apply(state: State, *pressed: str) -> tuple[State, list[Any]]:
    done = []
    for key in pressed:
        state, action = on_key(state, key)
        if action is not None:
            done.append(action)
    return state, done


def test_the_first_pool_is_selected_when_the_view_opens() -> None:
    assert MAIN.selected == ("bulk", None) and MAIN.mode is Mode.MAIN


@pytest.mark.parametrize(
    ("start", "pressed", "selected"),
    [
        (MAIN, "j", ("poison", None)),
        (MAIN, ["down"], ("poison", None)),
        (MAIN, "jj", ("bulk", 812)),
        (MAIN, "jjjjjj", ("poison", 900)),  # stops at the last row
        (MAIN, "k", ("bulk", None)),  # and at the first
        (ON_JOB, "k", ("poison", None)),
        (ON_JOB, "G", ("poison", 900)),
        (ON_JOB, "g", ("bulk", None)),
        (ON_JOB, ["end"], ("poison", 900)),
        (ON_JOB, ["home"], ("bulk", None)),
        (MAIN, ["pgdn"], ("poison", 900)),
        (ON_JOB, ["pgup"], ("bulk", None)),
        (ON_JOB, ["up", "up", "down"], ("poison", None)),
    ],
)
def test_arrows_and_j_k_move_the_selection(
    start: State, pressed: str | list[str], selected: tuple[str, int | None]
) -> None:
    state, done = _apply(start, *pressed)
    assert state.selected == selected and not done and state.mode is Mode.MAIN


QUESTION = "cancel job 812 (render, tenant acme, running 3m on host-a)? y/n"


@pytest.mark.parametrize(
    ("start", "key", "mode", "action", "said"),
    [
        (MAIN, "p", Mode.MAIN, PauseAction("bulk"), ""),
        (ON_PAUSED, "p", Mode.MAIN, Resume("poison"), ""),
        (ON_JOB, "p", Mode.MAIN, PauseAction("bulk"), ""),  # the job's pool
        (MAIN, "c", Mode.MAIN, None, "c cancels a running job: select one (↑↓ or j/k)"),
        (ON_JOB, "c", Mode.CONFIRM, None, ""),
        (MAIN, "d", Mode.DEAD, Reload(), ""),
        (MAIN, "/", Mode.FILTER, None, ""),
        (MAIN, "?", Mode.HELP, None, ""),
        (MAIN, "r", Mode.MAIN, None, "r acts on a dead letter: d opens them"),
        (MAIN, "x", Mode.MAIN, None, "x acts on a dead letter: d opens them"),
        (MAIN, "z", Mode.MAIN, None, "'z' does nothing here: ? shows the keys"),
        (MAIN, "enter", Mode.MAIN, None, ""),
        (replace(MAIN, message="paused pool bulk"), "j", Mode.MAIN, None, ""),  # read: gone
    ],
)
def test_keys_on_the_main_screen(
    start: State, key: str, mode: Mode, action: Any, said: str
) -> None:
    state, done = on_key(start, key)
    assert (state.mode, done, state.message) == (mode, action, said)
    assert not state.quit


@pytest.mark.parametrize("key", ["q", "esc", "ctrl-c"])
def test_q_esc_and_ctrl_c_quit_from_the_main_screen(key: str) -> None:
    state, done = on_key(ON_JOB, key)
    assert state.quit and done is None


def test_c_asks_before_it_cancels_and_y_cancels() -> None:
    asked, done = on_key(ON_JOB, "c")
    assert (asked.mode, asked.prompt, done) == (Mode.CONFIRM, QUESTION, None)
    assert livescreen.status_line(asked) == (QUESTION, "ask")
    assert livescreen.footer(asked) == "y yes  any other key: no"
    state, done = on_key(asked, "y")
    assert (state.mode, done, state.prompt, state.pending) == (Mode.MAIN, Cancel(812), "", None)


@pytest.mark.parametrize("key", ["n", "esc", "q", "j", "enter", "c"])
def test_any_other_answer_cancels_nothing(key: str) -> None:
    asked, _ = on_key(ON_JOB, "c")
    state, done = on_key(asked, key)
    assert done is None and not state.quit and state.mode is Mode.MAIN
    assert state.message == "not cancelled: job 812 runs on"
    assert state.selected == ("bulk", 812)


def test_a_job_without_a_tenant_says_so_in_the_question() -> None:
    asked, _ = on_key(replace(MAIN, selected=("poison", 900)), "c")
    assert asked.prompt == "cancel job 900 (parse, no tenant, running 5s on host-b)? y/n"


# ---- the dead letters ---------------------------------------------------------------------------


def test_d_opens_the_dead_letters_of_the_selected_jobs_pool() -> None:
    state, done = on_key(replace(MAIN, selected=("poison", 900)), "d")
    assert (state.mode, state.dead_pool, done) == (Mode.DEAD, "poison", Reload())
    assert livescreen.footer(state).startswith("↑↓/jk select  r requeue  x purge")


@pytest.mark.parametrize(
    ("start", "pressed", "mode", "actions", "selected", "said"),
    [
        (DEAD_OPEN, "r", Mode.DEAD, [Requeue(17)], 17, ""),
        (DEAD_OPEN, "jr", Mode.DEAD, [Requeue(18)], 18, ""),
        (DEAD_OPEN, "jjjjk", Mode.DEAD, [], 18, ""),
        (DEAD_OPEN, "x", Mode.CONFIRM, [], 17, ""),
        (DEAD_OPEN, "xy", Mode.DEAD, [Purge(17)], 17, ""),
        (DEAD_OPEN, "xn", Mode.DEAD, [], 17, "not purged: dead job 17 kept"),
        (DEAD_OPEN, "p", Mode.DEAD, [PauseAction("bulk")], 17, ""),
        (DEAD_OPEN, "c", Mode.DEAD, [], 17, "c cancels a running job: Esc back to the pools"),
        (DEAD_OPEN, "?", Mode.HELP, [], 17, ""),
        (DEAD_OPEN, "?j", Mode.DEAD, [], 17, ""),  # any key closes the keys, back here
        (replace(DEAD_OPEN, dead=(), dead_selected=None), "r", Mode.DEAD, [], None,
         "no dead letter selected"),
    ],
)  # fmt: skip
def test_keys_on_the_dead_letters(
    start: State, pressed: str, mode: Mode, actions: list[Any], selected: int | None, said: str
) -> None:
    state, done = _apply(start, *pressed)
    assert (state.mode, done, state.dead_selected, state.message) == (
        mode,
        actions,
        selected,
        said,
    )


def test_x_asks_with_what_died_and_when() -> None:
    asked, _ = on_key(DEAD_OPEN, "x")
    assert asked.prompt == (
        "purge dead job 17 (render, tenant acme, died 3m ago: memory_limit) for good? y/n"
    )


@pytest.mark.parametrize("key", ["esc", "d"])
def test_esc_or_d_goes_back_to_the_pools_with_the_selection_kept(key: str) -> None:
    state, done = on_key(replace(DEAD_OPEN, selected=("bulk", 812)), key)
    assert (state.mode, state.dead_pool, state.dead, done) == (Mode.MAIN, None, (), None)
    assert state.selected == ("bulk", 812) and not state.quit


def test_q_quits_from_the_dead_letters_and_from_the_keys() -> None:
    assert on_key(DEAD_OPEN, "q")[0].quit
    assert on_key(on_key(MAIN, "?")[0], "q")[0].quit


# ---- the filter ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("start", "pressed", "mode", "filter_", "typing", "reload"),
    [
        (MAIN, ["/", "a", "c", "m", "e"], Mode.FILTER, "", "acme", False),
        (MAIN, ["/", "a", "c", "backspace"], Mode.FILTER, "", "a", False),
        (MAIN, ["/", "a", "c", "m", "e", "enter"], Mode.MAIN, "acme", "", True),
        (MAIN, ["/", "q", "j", "?", "enter"], Mode.MAIN, "qj?", "", True),  # keys are text
        (replace(MAIN, filter="acme"), ["/", "esc"], Mode.MAIN, "", "", True),
        (replace(MAIN, filter="acme"), ["/", "backspace", "enter"], Mode.MAIN, "acm", "", True),
        (MAIN, ["/", " ", "enter"], Mode.MAIN, "", "", True),
        (DEAD_OPEN, ["/", "r", "enter"], Mode.DEAD, "r", "", True),
        (MAIN, ["/", "up", "pgdn"], Mode.FILTER, "", "", False),
    ],
)
def test_slash_filters_on_a_kind_or_tenant(
    start: State, pressed: list[str], mode: Mode, filter_: str, typing: str, reload: bool
) -> None:
    state, done = _apply(start, *pressed)
    assert (state.mode, state.filter, state.typing) == (mode, filter_, typing)
    assert done == ([Reload()] if reload else [])
    assert not state.quit


def test_the_filter_says_what_it_shows_and_how_to_clear_it() -> None:
    state, _ = _apply(MAIN, "/", "a", "c")
    assert livescreen.status_line(state) == ("only kind or tenant: ac▏", "typing")
    state, _ = _apply(state, "enter")
    assert state.message == "showing only kind or tenant 'ac' — / then Esc shows all"
    state, _ = _apply(state, "j")
    assert livescreen.status_line(state)[0].startswith("[only ac] ")


def test_the_worker_filter_matches_a_kind_or_a_tenant() -> None:
    v = view(row(snapshot(pool(workers=(
        worker("bulk", 1, "busy", kind="render", tenant="acme"),
        worker("bulk", 2, "busy", kind="parse", tenant="zeta"),
        worker("bulk", 3),
    )))))  # fmt: skip
    for text, slots in (("render", [1]), ("zeta", [2]), ("acme", [1]), ("nobody", [])):
        keep = liveview.keeps(text)
        assert keep is not None
        assert [r.worker.slot for r in v.workers if keep(r)] == slots
    assert liveview.keeps("") is None


# ---- refreshes keep the selection by identity ---------------------------------------------------


@pytest.mark.parametrize(
    ("selected", "rows", "kept"),
    [
        (None, ROWS, ("bulk", None)),  # the view opens on the first pool
        (("bulk", 812), ROWS[::-1], ("bulk", 812)),  # by id, wherever its row went
        (("bulk", 812), ROWS[:2], ("bulk", None)),  # the job ended: its pool
        (("poison", 900), (ROWS[0], ROWS[2]), ("bulk", None)),  # its pool went too: the first
        (("poison", None), (Row("other"), *ROWS), ("poison", None)),  # a new row above it
        (("bulk", 812), (), None),
    ],
)
def test_the_selection_survives_refreshes_by_pool_name_or_job_id(
    selected: tuple[str, int | None] | None, rows: tuple[Row, ...], kept: Any
) -> None:
    assert with_rows(replace(MAIN, selected=selected), rows).selected == kept


@pytest.mark.parametrize(
    ("selected", "dead", "kept"),
    [
        (18, DEAD[::-1], 18),  # by id
        (18, (DEAD[0], DEAD[2]), 25),  # requeued: the one that took its place
        (25, DEAD[:2], 18),  # the last one went: the new last
        (17, (), None),
        (None, DEAD, 17),  # opened: the first
    ],
)
def test_the_dead_letter_selection_survives_refreshes(
    selected: int | None, dead: tuple[DeadRow, ...], kept: int | None
) -> None:
    start = replace(DEAD_OPEN, dead_selected=selected)
    assert with_dead(start, dead, len(dead)).dead_selected == kept


def test_a_dead_row_says_how_long_ago_it_died_by_the_databases_clock() -> None:
    job = Job(
        id=5, kind="render", pool="bulk", state=JobState.DEAD, attempts=3, max_deliveries=3,
        payload={}, tenant="acme", key=None, priority=0, enqueued_at=100.0, available_at=100.0,
        started_at=110.0, finished_at=120.0, result=None, last_error="boom",
        error_kind=ErrorKind.MEMORY_LIMIT, peak_rss=None, duration=None,
    )  # fmt: skip
    assert DeadRow.of(job, now=300.0) == DeadRow(
        5, "render", "acme", "memory_limit", 3, 180.0, "boom"
    )


# ---- the whole story, as the tmux test plays it ---------------------------------------------


def test_pause_cancel_and_requeue_in_one_session() -> None:
    state = with_rows(State(), ROWS)
    state, done = _apply(state, "p")
    assert done == [PauseAction("bulk")]
    state = liveview.on_done(state, supervisor.actions.pause_key_line("bulk", True))
    assert livescreen.status_line(state) == (
        "paused pool bulk fleet-wide (running jobs finish) — p again to resume",
        "said",
    )
    paused = tuple(replace(r, paused=r.pool == "bulk" and r.job is None) for r in ROWS)
    state = with_rows(state, paused)
    state, done = _apply(state, "p", "j", "j", "c", "y", "d")
    assert done == [Resume("bulk"), Cancel(812), Reload()]
    assert (state.mode, state.dead_pool) == (Mode.DEAD, "bulk")  # the cancelled job's pool
    state = with_dead(state, DEAD, 3)  # the refresh the Reload asked for
    state, done = _apply(state, "r", "esc", "q")
    assert done == [Requeue(17)]
    assert state.quit


# ---- the words --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("out", "line"),
    [
        (CancelOutcome(cancelled=(812,)), "job 812: cancelled (it was queued; it will not run)"),
        (
            CancelOutcome(requested={812: "node-a"}),
            "job 812: cancel requested: node-a stops it within a second; it ends cancelled",
        ),
        (CancelOutcome(unchanged={812: JobState.DONE}), "job 812: done already; nothing changed"),
    ],
)
def test_what_a_cancel_from_the_view_says(out: CancelOutcome, line: str) -> None:
    assert supervisor.actions.cancel_key_line(812, out) == line


@pytest.mark.parametrize(
    ("lifted", "line"),
    [
        ([], "pool bulk was not paused; nothing changed"),
        (
            [Pause("bulk", None, 3600.0), Pause("bulk", "render", 7200.0)],
            "resumed pool bulk (and kinds render) (paused since 01:00:00Z): its jobs start "
            "again — p pauses it again",
        ),
        (
            [Pause("bulk", "render", 60.0)],
            "resumed kind render of pool bulk (paused since 00:01:00Z): its jobs start again "
            "— p pauses it again",
        ),
    ],
)
def test_what_a_resume_from_the_view_says(lifted: list[Pause], line: str) -> None:
    assert supervisor.actions.resume_key_line("bulk", lifted) == line


def test_a_pause_that_was_there_already_says_so() -> None:
    assert supervisor.actions.pause_key_line("bulk", False) == (
        "pool bulk was paused already; nothing changed — p again to resume"
    )


# ---- the frame --------------------------------------------------------------------------------


def frame(state: State, v: Any, width: int, height: int, styles: bool = False) -> str:
    console = Console(
        record=True,
        width=width,
        file=io.StringIO(),
        color_system="standard" if styles else None,
        force_terminal=styles,
    )
    console.print(livescreen.draw(state, v, width, height))
    return console.export_text(styles=styles)


def _opened(v: Any, width: int, height: int) -> State:
    state = with_rows(State(), livescreen.main_rows(State(), v, width, height))
    return state


@pytest.mark.parametrize(("width", "height"), [(80, 24), (160, 48)])
def test_the_interactive_frame_fits_and_ends_with_the_keys(width: int, height: int) -> None:
    v = busy_fleet(n_workers=60, gone=False)
    state = _opened(v, width, height)
    lines = frame(state, v, width, height).splitlines()
    assert len(lines) <= height and all(len(line) <= width for line in lines), lines
    assert lines[-1] == livescreen.FOOTER[Mode.MAIN]
    assert lines[-2] == "pool bulk: p pauses it, d opens its dead letters"
    assert "more workers" in lines[-3]  # the worker rows were cut to leave room for them


@pytest.mark.parametrize(("width", "height"), [(80, 24), (160, 48)])
def test_the_jobs_one_can_select_are_the_jobs_on_screen(width: int, height: int) -> None:
    v = busy_fleet(n_workers=60, gone=False)
    state = _opened(v, width, height)
    text = frame(state, v, width, height)
    table = text.split("elapsed/timeout", 1)[1].split("more workers")[0]
    on_screen = {int(line.split()[4 if width >= 120 else 3]) for line in table.splitlines()
                 if " busy " in line}  # fmt: skip
    selectable = {r.job for r in state.rows if r.job is not None}
    assert selectable == on_screen and len(selectable) > 3


def test_the_selection_is_in_reverse_video() -> None:
    v = busy_fleet(n_workers=3, gone=False)
    state = _opened(v, 80, 24)
    reverse = "\x1b[7m"
    text = frame(state, v, 80, 24, styles=True)
    marked = [line for line in text.splitlines() if reverse in line]
    assert len(marked) == 1 and "bulk" in marked[0], marked  # the first pool
    ids = [r.job for r in state.rows if r.job is not None]
    job = next(r for r in state.rows if r.job is not None and ids.count(r.job) == 1)
    text = frame(replace(state, selected=job.key), v, 80, 24, styles=True)
    marked = [line for line in text.splitlines() if reverse in line]
    assert len(marked) == 1 and f" {job.job} " in re.sub(r"\x1b\[[0-9;]*m", "", marked[0])


@pytest.mark.parametrize(("width", "height"), [(80, 24), (160, 48)])
def test_the_dead_letters_frame_fits_with_the_selected_one_marked(width: int, height: int) -> None:
    v = busy_fleet(n_workers=3, gone=False)
    many = tuple(replace(DEAD[1], job=100 + i) for i in range(60))
    state = with_dead(replace(MAIN, mode=Mode.DEAD, dead_pool="bulk"), many, 1200)
    state = replace(state, dead=many[: livescreen.dead_room(height)])
    lines = frame(state, v, width, height).splitlines()
    assert len(lines) <= height and all(len(line) <= width for line in lines), lines
    assert lines[1] == "dead letters of pool bulk: 1200, oldest first"
    assert lines[2].split() == ["job", "kind", "tenant", "died", "of", "ago", "tries", "last",
                                "error"]  # fmt: skip
    assert lines[3].split()[:5] == ["100", "render", "exception", "20s", "3"]
    assert "more" in lines[-3] and lines[-1] == livescreen.FOOTER[Mode.DEAD]
    styled = frame(state, v, width, height, styles=True).splitlines()
    assert "\x1b[7m" in styled[3] and not any("\x1b[7m" in line for line in styled[4:-2])


def test_the_keys_screen_lists_every_key() -> None:
    v = busy_fleet(n_workers=3, gone=False)
    state, _ = on_key(_opened(v, 80, 24), "?")
    text = frame(state, v, 80, 24)
    lines = text.splitlines()
    assert len(lines) <= 24 and all(len(line) <= 80 for line in lines)
    for needle in ("j k", "pause", "cancel", "dead letters", "requeue", "purge", "/", "quit"):
        assert needle in text, needle
    assert lines[-1] == "any key closes the keys  q quit"


def test_a_failed_read_is_said_until_a_read_succeeds() -> None:
    state = replace(MAIN, trouble="could not read the fleet: database is locked (frame of X)")
    assert livescreen.status_line(state) == (state.trouble, "trouble")
    assert livescreen.status_line(replace(state, message="paused"))[0] == "paused"


# What jobs write is hostile: an escape sequence in a tenant would retitle the operator's window
# (seen in tmux: the OSC in a tenant set the pane title and swallowed the rest of the cancel
# question), and "[/bold]" in an error message, handed to rich as a str cell, raised
# MarkupError and ended the view with a traceback.
HOSTILE_TENANT = "\x1b[31mevil\x1b]0;pwned\x07"
HOSTILE_ERROR = "bad [/bold] closing [bold]tag\x1b[2J"


def test_hostile_text_in_a_dead_letter_is_shown_as_written_not_obeyed() -> None:
    v = busy_fleet(n_workers=1, gone=False)
    dead = (DeadRow(17, "[/x]", HOSTILE_TENANT, "permanent", 1, 5.0, HOSTILE_ERROR),)
    state = with_dead(replace(MAIN, mode=Mode.DEAD, dead_pool="bulk"), dead, 1)
    for styles in (False, True):
        text = frame(state, v, 160, 24, styles=styles)
        assert "\x1b]" not in text and "\x07" not in text and "\x1b[2J" not in text
    plain_text = frame(state, v, 160, 24)
    assert "\\x1b[31mevi" in plain_text and "17   [/x]  " in plain_text
    assert "bad [/bold] closing [bold]tag\\x1b[2J" in plain_text


def test_hostile_text_in_a_question_or_a_kind_is_shown_as_written_not_obeyed() -> None:
    job = worker("bulk", 1, "busy", kind="[/bold]", tenant=HOSTILE_TENANT)
    snap = snapshot(pool("bulk", (job,)), hostname="host-\x1b[5m")
    v = view(row(snap))
    state = _opened(v, 80, 24)
    state = replace(state, selected=("bulk", job.job))
    asked, _ = liveview.on_key(state, "c")
    text = frame(asked, v, 160, 24)
    assert "[/bold]" in text.split("elapsed/timeout", 1)[1]  # the kind in the worker table
    assert "tenant \\x1b[31mevil\\x1b]0;pwned\\x07, running 2s on host-\\x1b[5m)? y/n" in text
    styled = frame(asked, v, 160, 24, styles=True)
    assert "\x1b]" not in styled and "\x07" not in styled and "\x1b[5m" not in styled


def test_an_arrow_split_across_reads_is_an_arrow_not_escape() -> None:
    """Over ssh an arrow's ESC can arrive alone, the ``[B`` a moment later. Read as they came,
    that was Escape (which quits the main screen) then '[' and 'B'. The reader waits for the
    rest of a sequence it is inside; the second half is written only once the ESC has been
    read (the pty's input queue is empty), so the split is certain."""
    master, slave = _keyboard()
    got: list[bytes] = []
    try:
        os.write(master, b"\x1b")
        reader = threading.Thread(target=lambda: got.append(terminal.read_keys(slave, 30.0)))
        reader.start()
        eventually(lambda: _waiting(slave) == 0)
        os.write(master, b"[B")
        reader.join(30)
        assert [keys.decode(g) for g in got] == [["down"]]
    finally:
        os.close(master)
        os.close(slave)


def test_escape_alone_is_escape_once_nothing_more_comes() -> None:
    master, slave = _keyboard()
    try:
        os.write(master, b"\x1b")
        assert keys.decode(terminal.read_keys(slave, 0.01)) == ["esc"]
    finally:
        os.close(master)
        os.close(slave)


def _keyboard() -> tuple[int, int]:
    """A pty whose terminal end is in the view's mode (cbreak: a byte is readable at once)."""
    master, slave = os.openpty()
    tty.setcbreak(slave)
    return master, slave


def _waiting(fd: int) -> int:
    """Bytes in the terminal's input queue, not yet read."""
    return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
