"""The fleetd command: exit codes, one-line errors, and what it prints."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from supervisor.cli import main
from tests.cli.test_client import write_config


@pytest.fixture
def config(tmp_path: Path, db_url: str) -> Path:
    return write_config(tmp_path, db_url)


def run(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def test_enqueue_prints_the_id_and_jobs_lists_it(config):
    out = run(
        "enqueue",
        "-c",
        str(config),
        "render",
        '{"doc": 7}',
        "--tenant",
        "acme",
        "--priority",
        "2",
        "--delay",
        "0s",
    )
    assert out.exit_code == 0, out.output
    jid = int(out.output)
    listed = run("jobs", "-c", str(config), "--json", "--state", "queued")
    (line,) = listed.output.splitlines()
    job = json.loads(line)
    assert job["id"] == jid and job["payload"] == {"doc": 7} and job["tenant"] == "acme"
    assert job["enqueued_at"].endswith("Z") and job["state"] == "queued"
    table = run("jobs", "-c", str(config))
    assert "render" in table.output and "queued" in table.output


def test_config_from_the_environment(config):
    out = run("enqueue", "render", env={"FLEETD_CONFIG": str(config)})
    assert out.exit_code == 0 and out.output.strip().isdigit()


@pytest.mark.parametrize(
    ("command", "args", "text"),
    [
        (["enqueue"], ["nope"], "no pool handles kind 'nope'"),
        (["enqueue"], ["render", "{bad"], "not JSON"),
        (["enqueue"], ["render", "[1]"], "JSON object"),
        (["enqueue"], ["render", "--delay", "later"], "delay"),
        (["dlq", "requeue"], ["1"], "no job with id 1"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(config, command, args, text):
    out = CliRunner().invoke(main, [*command, "-c", str(config), *args])
    assert out.exit_code == 2
    (line,) = out.output.strip().splitlines()
    assert line.startswith("fleetd: error:") and text in line
    assert run("jobs", "-c", str(config), "--json").output == ""


def test_dlq_requeue_of_a_live_job_is_refused(config):
    jid = run("enqueue", "-c", str(config), "render").output.strip()
    out = CliRunner().invoke(main, ["dlq", "requeue", "-c", str(config), jid])
    assert out.exit_code == 2 and "not dead" in out.output
    assert json.loads(run("jobs", "-c", str(config), "--json").output)["state"] == "queued"
    usage = CliRunner().invoke(main, ["dlq", "requeue", "-c", str(config)])
    assert usage.exit_code == 2


def test_a_bad_config_exits_2_naming_file_and_key(tmp_path):
    bad = tmp_path / "fleet.toml"
    bad.write_text('[pools.bulk]\nhandlers = { a = "m:f" }\nmemory_limit = "lots"\n')
    out = CliRunner().invoke(main, ["enqueue", "-c", str(bad), "a"])
    assert out.exit_code == 2
    assert "fleet.toml: pools.bulk.memory_limit: 'lots'" in out.output
    assert not (tmp_path / "fleetd.db").exists()


def test_missing_config_is_a_usage_error():
    out = CliRunner().invoke(main, ["jobs"], env={"FLEETD_CONFIG": ""})
    assert out.exit_code == 2 and "--config" in out.output


def test_the_installed_command_runs(config):
    proc = subprocess.run(
        [sys.executable, "-m", "supervisor", "enqueue", "-c", str(config), "nope"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "nope" in proc.stderr


def test_check_prints_the_sizing_plan_of_the_example_config():
    example = Path(__file__).resolve().parents[2] / "conf" / "fleet.example.toml"
    out = run("check", "-c", str(example))
    assert out.exit_code == 0, out.output
    for pool in ("bulk", "interactive", "poison"):
        assert f"pool {pool}:" in out.output
    assert "ceiling" in out.output and "bound by" in out.output and "RLIMIT_DATA" in out.output
    plan = json.loads(run("check", "-c", str(example), "--json").output)
    sizing = plan["pools"]["interactive"]["sizing"]
    assert sizing["ceiling"] <= min(sizing["max_workers"], sizing["max_inflight"])
    assert sizing["binding"] in {"max_workers", "cpu", "memory", "max_inflight"}
