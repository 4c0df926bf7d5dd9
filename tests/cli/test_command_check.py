"""``fleetd check`` and command handlers: each command's program looked up on PATH, and a bad
command table is the usual one-line config error with exit status 2."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.test_cli import run

POOL = """
[fleet]
database = "sqlite:///fleetd.db"

[pools.media]
bound = "io"
handlers = {{ {handlers} }}
"""


def write(tmp_path: Path, handlers: str) -> str:
    path = tmp_path / "fleet.toml"
    path.write_text(POOL.format(handlers=handlers))
    return str(path)


def test_check_says_whether_each_program_is_on_path(tmp_path: Path) -> None:
    config = write(
        tmp_path,
        'words = { command = ["sh", "-c", "wc -w"] }, '
        'pdf = { command = ["no-such-program-fleetd", "{path}"] }',
    )
    out = run("check", "-c", config)
    assert out.exit_code == 0, out.output
    assert "command words: sh found at /" in out.output
    assert "command pdf: no-such-program-fleetd NOT FOUND on PATH" in out.output
    plan = json.loads(run("check", "-c", config, "--json").output)
    commands = plan["pools"]["media"]["commands"]
    assert commands["pdf"] == {"command": ["no-such-program-fleetd", "{path}"], "program": None}
    assert commands["words"]["program"].endswith("/sh")


def test_a_bad_command_table_is_one_line_and_exit_2(tmp_path: Path) -> None:
    for table, key in (
        ("command = []", "pools.media.handlers.pdf.command"),
        ('command = ["x"], retries = 3', "pools.media.handlers.pdf.retries"),
    ):
        out = run("check", "-c", write(tmp_path, f"pdf = {{ {table} }}"))
        assert out.exit_code == 2, out.output
        lines = out.output.strip().splitlines()
        assert len(lines) == 1 and key in lines[0], out.output
