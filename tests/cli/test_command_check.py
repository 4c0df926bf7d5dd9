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


RATED = """
[fleet]
database = "{database}"

[pools.api]
bound = "io"
max_workers = 40
job_memory = "8MiB"
rate_limit = "50/s"
handlers = {{ call = "tests.support.handlers:noop" }}
"""


def test_check_shows_the_ceiling_a_rate_limit_allows_at_the_measured_service_time(
    tmp_path: Path, db_url: str
) -> None:
    """50/s × 200 ms recorded by the database / utilization 0.7 = 14.3: 15 workers, named as
    the binding constraint. Before any job is done there is no figure, and check says so."""
    from supervisor.model import Ack, NewJob
    from supervisor.store import open_store

    path = tmp_path / "fleet.toml"
    path.write_text(RATED.format(database=db_url))
    store = open_store(db_url)
    try:
        out = run("check", "-c", str(path))
        assert out.exit_code == 0, out.output
        assert "bound by max_workers" in out.output
        assert "rate - (50/s: no job done in the last 300s" in out.output
        store.enqueue_many([NewJob("call", "api", "{}", 3) for _ in range(40)])
        got = store.claim(pool="api", kinds={"call"}, n=40, node="n", lease=30)
        assert not store.ack([Ack(c.lease, duration=0.2) for c in got])
    finally:
        store.close()
    out = run("check", "-c", str(path))
    assert out.exit_code == 0, out.output
    assert "ceiling 15 (bound by rate)" in out.output, out.output
    assert "rate 15 (50/s × 200ms mean service time of 40 jobs / utilization 0.7)" in out.output
    sizing = json.loads(run("check", "-c", str(path), "--json").output)["pools"]["api"]["sizing"]
    assert (sizing["ceiling"], sizing["binding"], sizing["rate"]) == (15, "rate", 15)
    assert sizing["service_time"]["seconds"] == 0.2 and sizing["service_time"]["jobs"] == 40
