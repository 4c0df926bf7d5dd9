"""Command handlers' pure decisions (workers/command_rules.py), their runner (workers/command.py)
and their config (supervisor/config/): argv substitution, the result of stdout, how an ending
is classified, and the one-line errors of a bad handler table."""

from __future__ import annotations

import doctest
import errno
import os
import signal
import tempfile
from pathlib import Path

import pytest

from supervisor.config import load_config
from supervisor.errors import ConfigError
from workers import command, command_rules, protocol, scratch, tree
from workers.command import CommandHandler
from workers.command_rules import (
    RESULT_TEXT,
    CommandSpec,
    Ending,
    MissingField,
    build_environment,
    classify,
    result_of,
    stderr_tail,
    substitute,
)

SPEC = CommandSpec(("/usr/bin/pdftotext", "{path}", "-"), 5.0, frozenset({2, 65}))


def test_doctests_pass() -> None:
    result = doctest.testmod(command_rules)
    assert result.attempted > 0 and result.failed == 0


# ---- substitute ----

SUBSTITUTIONS = [
    (("p", "{path}"), {"path": "a b.pdf"}, ["p", "a b.pdf"]),  # one argument, spaces kept
    (("p", "--page={n}", "{n}"), {"n": 3}, ["p", "--page=3", "3"]),  # inside an argument
    (("p", "{x}"), {"x": 1.5}, ["p", "1.5"]),
    (("p", "{'a': 1}", "{}", "{ x }"), {}, ["p", "{'a': 1}", "{}", "{ x }"]),  # not names
    (("p", "$HOME", "*", "; rm -rf /"), {}, ["p", "$HOME", "*", "; rm -rf /"]),  # no shell
    (("p", "--", "{a}{b}"), {"a": "-", "b": "x"}, ["p", "--", "-x"]),  # after --: an operand
    (("p", "--doc={d}", "-o{d}"), {"d": "-x"}, ["p", "--doc=-x", "-o-x"]),  # options by config
    (("p", "{n}"), {"n": 3}, ["p", "3"]),
    (("p", "x{a}"), {"a": "-v"}, ["p", "x-v"]),
    (("awk", "{{print}}"), {}, ["awk", "{print}"]),  # literal braces
    (("awk", "{{print {f}}}"), {"f": "$1"}, ["awk", "{print $1}"]),
    (("p", "{{{a}}}", "}}{{"), {"a": "v"}, ["p", "{v}", "}{"]),
    (("p", "{{a}"), {"a": "v"}, ["p", "{a}"]),  # {{ first: then a literal "a}"
]


@pytest.mark.parametrize(("argv", "payload", "expected"), SUBSTITUTIONS)
def test_substitute(argv: tuple[str, ...], payload: dict, expected: list[str]) -> None:
    assert substitute(argv, payload) == expected


MISSING = [
    ({"other": 1}, "has no field 'path'"),
    ({"path": None}, "is a null"),
    ({"path": True}, "is a bool"),
    ({"path": ["a"]}, "is a list"),
    ({"path": {"a": 1}}, "is a dict"),
    ({"path": "a\0b"}, "NUL"),
    (["path"], "not a JSON object"),
    ({"path": "-opw=x"}, "starts with '-' and would be read as an option"),
    ({"path": -1}, "'path' makes the argument '-1'"),
    ({"path": "-"}, 'put "--" before it'),
]


@pytest.mark.parametrize(("payload", "fragment"), MISSING)
def test_substitute_refuses(payload: object, fragment: str) -> None:
    with pytest.raises(MissingField, match=fragment.replace("(", r"\(")):
        substitute(("p", "{path}"), payload)


def test_option_injection_is_permanent_and_runs_nothing() -> None:
    outcome = CommandHandler(CommandSpec(("cat", "{path}"))).run({"path": "-opw=x"})
    assert outcome.error_kind == protocol.PERMANENT and "not run" in outcome.message


def test_a_missing_field_hints_at_literal_braces() -> None:
    with pytest.raises(MissingField, match=r"write \{\{print\}\} for a literal \{print\}"):
        substitute(("awk", "{print}"), {})


def test_placeholders_in_order_once_each() -> None:
    spec = CommandSpec(("p", "{b}", "{a}-{b}", "x"))
    assert spec.placeholders() == ["b", "a"]


# ---- result_of ----

RESULTS = [
    (b'{"pages": 3}\n', True, {"exit_code": 0, "json": {"pages": 3}}),
    (b"42", True, {"exit_code": 0, "json": 42}),
    (b"hello\n", True, {"exit_code": 0, "text": "hello\n"}),
    (b"", True, {"exit_code": 0, "text": ""}),
    (b"NaN", True, {"exit_code": 0, "text": "NaN"}),  # not storable JSON: text
    (b'{"a": 1}', False, {"exit_code": 0, "text": '{"a": 1}'}),  # cut: never JSON
    (b"\xff\xfe", True, {"exit_code": 0, "text": "\ufffd\ufffd"}),
]


@pytest.mark.parametrize(("stdout", "complete", "expected"), RESULTS)
def test_result_of(stdout: bytes, complete: bool, expected: dict) -> None:
    assert result_of(stdout, complete) == expected


def test_result_text_is_the_last_4_kib() -> None:
    text = result_of(b"a" * 10_000 + b"END", True)["text"]
    assert len(text) == RESULT_TEXT and text.endswith("END")


def test_stderr_tail_keeps_the_last_lines_on_one_line() -> None:
    stderr = b"".join(b"line %d\n" % i for i in range(30)) + b"\n  \nfinal words\n"
    tail = stderr_tail(stderr)
    assert tail.endswith("line 29 | final words") and "line 20" not in tail and "\n" not in tail


# ---- classify ----


def exited(code: int) -> int:
    return code << 8


CLASSIFY = [
    # (ending, error_kind or None for done, fragments of the message)
    (Ending(exited(0)), None, []),
    (
        Ending(exited(1)),
        protocol.EXCEPTION,
        ["pdftotext exited with code 1", "stderr: warming up | boom"],
    ),
    (Ending(exited(65)), protocol.PERMANENT, ["code 65 (a permanent code", "boom"]),
    (Ending(exited(2)), protocol.PERMANENT, ["code 2"]),
    (Ending(signal.SIGSEGV), protocol.CRASHED, ["killed by SIGSEGV", "boom"]),
    (Ending(signal.SIGKILL), protocol.CRASHED, ["killed by SIGKILL"]),
    (Ending(signal.SIGKILL, "timeout", 2.04), protocol.TIMEOUT, ["past its timeout (2.0s)"]),
    (
        Ending(signal.SIGTERM, "stall", 1.0, 1.0),
        protocol.TIMEOUT,
        ["wrote nothing to stdout or stderr for 1s (stall_timeout)"],
    ),
    (Ending(exited(0), "timeout", 3.0), protocol.TIMEOUT, ["timeout"]),  # our stop wins
]


MEMORY = protocol.MEMORY_LIMIT
OUT_OF_MEMORY = [
    # (ending, stderr, error_kind, fragments)
    (Ending(exited(1)), b"Traceback ...\nMemoryError\n", MEMORY, ["code 1 after an allocation"]),
    (Ending(exited(1)), b"convert: Cannot allocate memory\n", MEMORY, ["'Cannot allocate"]),
    (Ending(exited(2)), b"x: cannot allocate memory\n", MEMORY, ["code 2"]),  # over permanent
    (
        Ending(signal.SIGABRT),
        b"terminate called after throwing an instance of 'std::bad_alloc'\n",
        MEMORY,
        ["killed by SIGABRT after an allocation failed"],
    ),
    (Ending(signal.SIGSEGV), b"fatal: Out of memory, malloc failed\n", MEMORY, ["SIGSEGV"]),
    (Ending(exited(0)), b"warning: out of memory cache disabled\n", None, []),  # done is done
    (Ending(signal.SIGKILL), b"out of memory\n", protocol.CRASHED, ["SIGKILL"]),
    (Ending(signal.SIGKILL, "timeout", 2.0), b"MemoryError\n", protocol.TIMEOUT, ["timeout"]),
    (Ending(exited(1)), b"bad header\n", protocol.EXCEPTION, ["code 1"]),
    (Ending(signal.SIGABRT), b"assertion failed\n", protocol.CRASHED, ["SIGABRT"]),
]


@pytest.mark.parametrize(("ending", "stderr", "kind", "fragments"), OUT_OF_MEMORY)
def test_classify_out_of_memory(
    ending: Ending, stderr: bytes, kind: str | None, fragments: list[str]
) -> None:
    outcome = classify(SPEC, ending, b"", True, stderr)
    assert outcome.error_kind == kind, outcome.message
    for fragment in fragments:
        assert fragment in outcome.message


@pytest.mark.parametrize(("ending", "kind", "fragments"), CLASSIFY)
def test_classify(ending: Ending, kind: str | None, fragments: list[str]) -> None:
    outcome = classify(SPEC, ending, b'{"ok": true}', True, b"warming up\nboom\n")
    assert outcome.error_kind == kind
    if kind is None:
        assert outcome.result == {"exit_code": 0, "json": {"ok": True}}
    for fragment in fragments:
        assert fragment in outcome.message


def test_exit_status_helpers_agree_with_the_kernel() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(65)
    _, status = os.waitpid(pid, 0)
    assert status == exited(65)


# ---- config ----

POOL = "[pools.media]\nhandlers = { pdf_text = { %s } }\n"

CONFIG_ERRORS = [
    ("command = []", "pools.media.handlers.pdf_text.command", "[] is not a command"),
    ('command = "pdftotext"', "pools.media.handlers.pdf_text.command", "is not a command"),
    ('command = ["", "x"]', "pools.media.handlers.pdf_text.command[0]", "not a program"),
    ('command = ["x", 3]', "pools.media.handlers.pdf_text.command[1]", "not a string"),
    ('command = ["{prog}"]', "pools.media.handlers.pdf_text.command[0]", "fixed program"),
    ('command = ["x"], timeout = 3', "pools.media.handlers.pdf_text.timeout", "unknown key"),
    (
        'command = ["x"], stall_timeout = "0s"',
        "pools.media.handlers.pdf_text.stall_timeout",
        "zero",
    ),
    (
        'command = ["x"], permanent_codes = [0]',
        "pools.media.handlers.pdf_text.permanent_codes[0]",
        "not an exit code",
    ),
    (
        'command = ["x"], permanent_codes = 2',
        "pools.media.handlers.pdf_text.permanent_codes",
        "not a list",
    ),
    ('stall_timeout = "1s"', "pools.media.handlers.pdf_text", "without command"),
    ('command = ["x"], env = { A = 1 }', "pools.media.handlers.pdf_text.env.A", "not a string"),
    ('command = ["x"], env = "A=1"', "pools.media.handlers.pdf_text.env", "not a table"),
    (
        'command = ["x"], env = { "A B" = "1" }',
        'pools.media.handlers.pdf_text.env."A B"',
        "not a variable name",
    ),
]


@pytest.mark.parametrize(("table", "key", "fragment"), CONFIG_ERRORS)
def test_config_errors(tmp_path: Path, table: str, key: str, fragment: str) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(POOL % table)
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    message = str(caught.value)
    assert "\n" not in message and f": {key}: " in message and fragment in message


def test_config_reads_a_command(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    table = 'command = ["sh", "-c", "cat", "{x}"], stall_timeout = "250ms", permanent_codes = [3]'
    path.write_text(POOL % (table + ', env = { LANG = "C", B = "2" }'))
    spec = load_config(path, environ={}).pools["media"].handlers["pdf_text"]
    env = (("B", "2"), ("LANG", "C"))
    assert spec == CommandSpec(("sh", "-c", "cat", "{x}"), 0.25, frozenset({3}), env)


BASE_ENV = {
    "PATH": "/usr/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C",
    "TZ": "UTC",
    "HOME": "/root",
    "DATABASE_URL": "postgresql://u:secret@db/x",
    "PGPASSWORD": "secret",
    "FLEETD_JOB_ID": "old",
}

FOLDER = {"HOME": "/j", "TMPDIR": "/j", "TMP": "/j", "TEMP": "/j"}
KEPT = {"PATH": "/usr/bin", "LANG": "C.UTF-8", "LC_ALL": "C", "TZ": "UTC", "FLEETD_JOB_ID": "old"}

ENVIRONMENTS = [
    (BASE_ENV, {}, (), {**KEPT, **FOLDER}),
    (BASE_ENV, {"FLEETD_JOB_ID": "7"}, (), {**KEPT, **FOLDER, "FLEETD_JOB_ID": "7"}),
    (
        BASE_ENV,
        {},
        (("MAGICK_LIMIT", "1"), ("PATH", "/opt/bin")),
        {**KEPT, **FOLDER, "MAGICK_LIMIT": "1", "PATH": "/opt/bin"},
    ),
    (BASE_ENV, {}, (("HOME", "/elsewhere"),), {**KEPT, **FOLDER, "HOME": "/elsewhere"}),
    ({"LC_TIME": "C", "LCX": "no", "PATHX": "no"}, {}, (), {"LC_TIME": "C", **FOLDER}),
]


@pytest.mark.parametrize(("base", "job", "extra", "expected"), ENVIRONMENTS)
def test_build_environment(base: dict, job: dict, extra: tuple, expected: dict) -> None:
    assert build_environment(base, "/j", job, extra) == expected


# ---- a runner that fails does not raise ----


def test_run_without_a_writable_temp_dir_fails_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", "/nonexistent/fleetd-tmp")
    outcome = CommandHandler(CommandSpec(("true",))).run({})
    assert outcome.error_kind == protocol.EXCEPTION
    assert "cannot create the job's folder in /nonexistent/fleetd-tmp" in outcome.message


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_run_when_pidfd_open_fails_fails_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(pid: int) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    def the_sleep() -> list[int]:  # only the program: no other child of the test process
        return [p for p in tree.descendants() if _cmdline(p) == b"sleep\x0030\x00"]

    monkeypatch.setattr(os, "pidfd_open", refuse)
    monkeypatch.setattr(tree, "job_processes", the_sleep)
    outcome = CommandHandler(CommandSpec(("sleep", "30"))).run({})
    assert outcome.error_kind == protocol.EXCEPTION
    assert "running 'sleep' failed in the worker: OSError: Too many open files" in outcome.message
    assert outcome.duration < 5  # the program was killed, not waited for


# ---- where job folders live (workers.scratch) ----

STALE = [
    (["fleetd-10", "fleetd-11", "fleetd-12"], {11}, 12, ["fleetd-10"]),
    (["fleetd-job-abc", "fleetd-", "fleetd-1x", "other-10", "fleetd-10"], set(), 1, ["fleetd-10"]),
    ([], set(), 1, []),
]


@pytest.mark.parametrize(("names", "alive", "own", "expected"), STALE)
def test_stale_supervisor_dirs(names: list[str], alive: set, own: int, expected: list) -> None:
    assert scratch.stale(names, alive.__contains__, own) == expected


def test_worker_dir_names_pool_slot_and_pid() -> None:
    assert scratch.worker_dir("/t/fleetd-9", "media", 2, 77) == "/t/fleetd-9/media-2-77"
    assert scratch.worker_dir("/t/fleetd-9", "a/b", 1, 5) == "/t/fleetd-9/a_b-1-5"


def test_make_root_removes_the_dirs_of_gone_supervisors(tmp_path: Path) -> None:
    gone = os.fork()
    if gone == 0:
        os._exit(0)
    os.waitpid(gone, 0)
    (tmp_path / f"fleetd-{gone}" / "pool-1-5" / "fleetd-job-x").mkdir(parents=True)
    (tmp_path / f"fleetd-{os.getppid()}").mkdir()  # a running supervisor's: kept
    root, removed = scratch.make_root(str(tmp_path), os.getpid())
    assert root == str(tmp_path / f"fleetd-{os.getpid()}") and os.path.isdir(root)
    assert removed == [str(tmp_path / f"fleetd-{gone}")]
    assert not (tmp_path / f"fleetd-{gone}").exists()
    assert (tmp_path / f"fleetd-{os.getppid()}").exists()


def test_remove_takes_an_empty_dir_a_full_one_and_a_missing_one(tmp_path: Path) -> None:
    empty, full = tmp_path / "pool-1-5", tmp_path / "pool-2-6"
    empty.mkdir()
    (full / "fleetd-job-x").mkdir(parents=True)
    (full / "fleetd-job-x" / "left").write_text("x")
    for path in (empty, full, tmp_path / "never-made"):
        scratch.remove(str(path))
        assert not path.exists()


def test_only_a_pool_with_a_command_makes_job_folders() -> None:
    assert command.runs_commands({"a": print, "b": CommandHandler(SPEC)})
    assert not command.runs_commands({"a": print})
    assert not command.runs_commands({})


# ---- end_job_tree: its default follows the pool's kinds ----

END_JOB_TREE = [
    ('handlers = { a = "m:f" }', False),
    ('handlers = { a = "m:f", b = { command = ["x"] } }', True),
    ('handlers = { b = { command = ["x"] } }\nend_job_tree = false', False),
    ('handlers = { a = "m:f" }\nend_job_tree = true', True),
]


@pytest.mark.parametrize(("body", "expected"), END_JOB_TREE)
def test_end_job_tree_default(tmp_path: Path, body: str, expected: bool) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(f"[pools.media]\n{body}\n")
    assert load_config(path, environ={}).pools["media"].ends_job_tree is expected


def test_end_job_tree_must_be_a_boolean(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text('[pools.media]\nhandlers = { a = "m:f" }\nend_job_tree = "yes"\n')
    with pytest.raises(ConfigError, match=r"pools.media.end_job_tree: 'yes' is not a boolean"):
        load_config(path, environ={})


def test_a_note_every_worker_would_print_is_printed_by_the_first_only(tmp_path) -> None:
    from workers import scratch

    assert scratch.first_time(str(tmp_path), "shm") is True
    assert scratch.first_time(str(tmp_path), "shm") is False
    assert scratch.first_time(str(tmp_path), "other") is True
    assert scratch.first_time(None, "shm") is True  # no directory: say it every time
    assert scratch.first_time(str(tmp_path / "gone"), "shm") is True
