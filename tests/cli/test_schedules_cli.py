"""fleetd schedules, check and status with schedules; bad schedule configs exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from supervisor.cli import main
from supervisor.config import load_config
from supervisor.run.schedulepass import schedule_pass
from supervisor.store import open_store
from tests.cli.test_client import write_config
from tests.integration.fleet import handlers
from tests.integration.fleet import write_config as fleet_config

SCHEDULE = '\n[schedules.nightly]\nkind = "index"\ncron = "0 2 * * *"\ntimezone = "Europe/Paris"\n'


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.fixture
def config(tmp_path: Path, db_url: str) -> Path:
    open_store(db_url).close()
    path = write_config(tmp_path, db_url)
    path.write_text(path.read_text() + SCHEDULE)
    return path


def test_schedules_lists_last_and_next_tick(config: Path, store, clock) -> None:
    assert "waiting" in run("schedules", "-c", str(config)).output  # no supervisor ran it yet
    specs = load_config(config).schedule_specs()
    schedule_pass(store, specs)  # first sight: starts now
    clock.advance(86_400)
    (outcome,) = schedule_pass(store, specs).outcomes
    (_, job_id) = outcome.enqueued[0]
    listed = json.loads(run("schedules", "-c", str(config), "--json").output)
    assert listed["last_job"] == job_id and listed["last_state"] == "queued"
    assert listed["policies"] == "catch_up once, overlap skip"
    assert listed["timing"] == 'cron "0 2 * * *" (Europe/Paris)'
    table = run("schedules", "-c", str(config)).output
    assert "nightly" in table and str(job_id) in table


def test_check_shows_the_next_three_ticks(tmp_path: Path) -> None:
    path = fleet_config(
        tmp_path,
        f"sqlite:///{tmp_path / 'x.db'}",
        {"bulk": {"handlers": handlers("echo")}},
        {"nightly": {"kind": "echo", "cron": "0 2 * * *", "timezone": "Europe/Paris"}},
    )
    plan = json.loads(run("check", "-c", str(path), "--json").output)["schedules"]["nightly"]
    assert len(plan["next"]) == 3 and all(t.endswith(":00:00Z") for t in plan["next"])
    assert plan["pool"] == "bulk" and plan["catch_up"] == "once"
    text = run("check", "-c", str(path)).output
    assert "schedule nightly: echo (pool bulk)" in text and plan["next"][2] in text


BAD = [
    ('cron = "0 25 * * *"', "schedules.nightly.cron: '0 25 * * *' is not a cron expression"),
    ('every = "1h"', "schedules.nightly.every: both cron and every are set"),
    ('catch_up = "maybe"', "schedules.nightly.catch_up: 'maybe' is not allowed"),
]


@pytest.mark.parametrize("command", [["check"], ["schedules"], ["start"], ["jobs"]])
@pytest.mark.parametrize(("line", "text"), BAD)
def test_a_bad_schedule_exits_2_with_one_line(
    tmp_path: Path, command: list[str], line: str, text: str
) -> None:
    path = write_config(tmp_path, f"sqlite:///{tmp_path / 'x.db'}")
    body = SCHEDULE.replace('cron = "0 2 * * *"\n', "") if "cron" in line else SCHEDULE
    path.write_text(path.read_text() + body + line + "\n")
    out = CliRunner().invoke(main, [*command, "-c", str(path)])
    assert out.exit_code == 2, out.output
    (message,) = out.output.strip().splitlines()
    assert message.startswith("fleetd: error: ") and text in message, message
    assert not (tmp_path / "x.db").exists()


def test_an_unknown_kind_exits_2(tmp_path: Path) -> None:
    path = write_config(tmp_path, f"sqlite:///{tmp_path / 'x.db'}")
    path.write_text(path.read_text() + SCHEDULE.replace('"index"', '"reindex"'))
    out = CliRunner().invoke(main, ["check", "-c", str(path)])
    assert out.exit_code == 2 and "schedules.nightly.kind: 'reindex' is not a kind" in out.output
