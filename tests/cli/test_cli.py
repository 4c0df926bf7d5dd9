"""The fleetd command: exit codes, one-line errors, and what it prints."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from supervisor.cli import main
from supervisor.model import ErrorKind, Failure, NewJob
from supervisor.store import open_store
from tests.cli.test_client import write_config


@pytest.fixture
def config(tmp_path: Path, db_url: str) -> Path:
    """A fleet.toml whose database exists and is empty (commands other than enqueue and
    start do not create one)."""
    open_store(db_url).close()
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
        (["jobs"], ["--pool", "bulkk"], "no pool 'bulkk' here or in the database (pools: bulk"),
        (["dlq", "list"], ["--pool", "bulkk"], "no pool 'bulkk'"),
        (["dlq", "purge"], ["--all", "--pool", "bulkk"], "no pool 'bulkk'"),
        (["dlq", "requeue"], ["--all", "--pool", "bulkk"], "no pool 'bulkk'"),
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
    # which order each pool's claims take
    assert plan["pools"]["interactive"]["order"] == {
        "order": "fair",
        "weights": {"acme": 3.0},
        "capped": True,
    }
    assert plan["pools"]["bulk"]["order"]["capped"] is False
    assert "order: fair share between tenants, weights acme 3, others 1" in out.output


def test_check_says_a_pool_without_fair_share_is_fifo(tmp_path):
    config = tmp_path / "fleet.toml"
    config.write_text(
        '[fleet]\ndatabase = "sqlite:///x.db"\n[pools.bulk]\nhandlers = { r = "json:dumps" }\n'
        "fair = false\n"
    )
    out = run("check", "-c", str(config))
    assert out.exit_code == 0, out.output
    assert "order: priority, then FIFO, whatever the tenant (fair = false)" in out.output


def _dead_job(db_url: str, error: str = "no doc") -> int:
    """A job dead-lettered the way a supervisor does it: claimed, then failed for good."""
    store = open_store(db_url)
    try:
        (jid,) = store.enqueue_many([NewJob("render", "bulk", "{}", 4)])
        (claimed,) = store.claim(pool="bulk", kinds={"render"}, n=1, node="n", lease=30)
        store.fail([Failure(claimed.lease, ErrorKind.PERMANENT, error, retry_delay=None)])
        return jid
    finally:
        store.close()


def test_dlq_takes_the_config_before_or_after_its_subcommand(config, db_url):
    jid = _dead_job(db_url)
    # the contract's order, then the subcommand's own option, then the environment
    listed = run("dlq", "-c", str(config), "list", "--json")
    assert listed.exit_code == 0, listed.output
    assert json.loads(listed.output)["id"] == jid
    assert run("dlq", "list", "-c", str(config), "--json").output == listed.output
    assert run("dlq", "list", "--json", env={"FLEETD_CONFIG": str(config)}).output == listed.output
    out = run("dlq", "-c", str(config), "requeue", str(jid))
    assert out.exit_code == 0 and out.output.strip() == f"requeued 1 job(s): {jid}"
    assert json.loads(run("jobs", "-c", str(config), "--json").output)["state"] == "queued"
    missing = CliRunner().invoke(main, ["dlq", "list"], env={"FLEETD_CONFIG": ""})
    assert missing.exit_code == 2 and "--config" in missing.output


def test_a_table_piped_to_another_program_is_one_line_a_job(config, db_url):
    error = "ValueError: " + " ".join(f"word{i}" for i in range(40))
    jid = _dead_job(db_url, error)
    header, row = run("dlq", "list", "-c", str(config)).output.splitlines()  # not a terminal
    assert header.split()[0] == "id" and row.split()[0] == str(jid)
    assert error in row


def test_a_pool_only_the_database_knows_can_be_filtered(config, db_url):
    # another host's config, or a pool since removed from this one: its jobs are still there
    store = open_store(db_url)
    try:
        (jid,) = store.enqueue_many([NewJob("resize", "retired", "{}", 3)])
    finally:
        store.close()
    out = run("jobs", "-c", str(config), "--pool", "retired", "--json")
    assert out.exit_code == 0 and json.loads(out.output)["id"] == jid


def test_dlq_refuses_two_different_configs(config, tmp_path):
    other = tmp_path / "other.toml"
    other.write_text(config.read_text())
    out = CliRunner().invoke(main, ["dlq", "-c", str(config), "list", "-c", str(other)])
    assert out.exit_code == 2 and "-c given twice" in out.output
    same = run("dlq", "-c", str(config), "list", "-c", str(config))
    assert same.exit_code == 0


def test_a_sqlite_file_uri_is_opened_where_sqlite_finds_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a relative file: URI is SQLite's to resolve, from the cwd
    config = write_config(tmp_path, "sqlite:///file:uri.db?uri=true")
    assert run("enqueue", "-c", str(config), "render").exit_code == 0
    listed = run("jobs", "-c", str(config), "--json")
    assert listed.exit_code == 0 and json.loads(listed.output)["kind"] == "render"


def test_dlq_purge_with_the_config_first(config, db_url):
    _dead_job(db_url)
    assert run("dlq", "-c", str(config), "purge").exit_code == 2  # wide: asks for --all
    out = run("dlq", "-c", str(config), "purge", "--all")
    assert out.exit_code == 0 and out.output.strip().startswith("purged 1 job(s): ")
    assert run("jobs", "-c", str(config), "--json").output == ""


@pytest.mark.parametrize(
    "command",
    [["jobs"], ["status", "--json"], ["status", "--once"], ["dlq", "list"], ["check", "--live"]],
)
def test_commands_that_read_do_not_create_a_database_at_a_mistyped_path(tmp_path, command):
    typo = tmp_path / "fleetd-typo.db"
    config = write_config(tmp_path, f"sqlite:///{typo}")
    out = CliRunner().invoke(main, [*command, "-c", str(config)])
    assert out.exit_code == 2, out.output
    (line,) = out.output.strip().splitlines()
    assert line.startswith("fleetd: error: no database at") and str(typo) in line
    assert not typo.exists()


def test_enqueue_creates_the_database_as_start_does(tmp_path):
    db = tmp_path / "fresh.db"
    config = write_config(tmp_path, f"sqlite:///{db}")
    out = run("enqueue", "-c", str(config), "render")
    assert out.exit_code == 0 and out.output.strip().isdigit()
    assert db.exists()


def test_check_live_fails_when_no_supervisor_runs(config):
    out = CliRunner().invoke(main, ["check", "--live", "-c", str(config)])
    assert out.exit_code == 1
    assert "UNHEALTHY (0 live node(s)" in out.output
    assert "  no_live_node: no supervisor using this database is running" in out.output


def test_the_live_view_piped_prints_frame_after_frame_until_ctrl_c(config):
    proc = subprocess.Popen(
        [sys.executable, "-m", "supervisor", "status", "-c", str(config), "--interval", "0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        frames = 0
        for line in proc.stdout:  # a frame starts with the fleet's line; wait for three
            frames += line.startswith("fleetd ")
            if frames == 3:
                break
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        proc.kill()
        proc.wait()
    assert frames == 3


# ---- operator controls: dlq by filter, cancel, pause (issue 15) --------------------------


def test_dlq_requeue_and_purge_by_filter_say_what_they_touched(config, db_url):
    first, second = _dead_job(db_url), _dead_job(db_url)
    out = run("dlq", "-c", str(config), "requeue", "--error-kind", "timeout", "--since", "1h")
    assert (
        out.output.strip()
        == "no dead job matching error-kind=timeout since=3600s; nothing requeued"
    )
    out = run("dlq", "-c", str(config), "requeue", "--kind", "render", "--error-kind", "permanent")
    assert out.output.strip() == (
        f"requeued 2 job(s) matching kind=render error-kind=permanent: {first}, {second}"
    )
    third = _dead_job(db_url)
    dead = [
        j["id"]
        for j in map(
            json.loads, run("dlq", "-c", str(config), "list", "--json").output.splitlines()
        )
    ]
    out = run("dlq", "-c", str(config), "purge", "--since", "1h")
    # the third dead job (its claim took the oldest queued job: one of the two requeued)
    assert third and len(dead) == 1
    assert out.output.strip() == f"purged 1 job(s) matching since=3600s: {dead[0]}"
    bad = CliRunner().invoke(main, ["dlq", "requeue", "-c", str(config), "--since", "soon"])
    assert bad.exit_code == 2
    both = CliRunner().invoke(main, ["dlq", "purge", "-c", str(config), "--all", "--kind", "x"])
    assert both.exit_code == 2 and "--all" in both.output


def test_cancel_pause_and_resume_say_what_they_did(config):
    jid = run("enqueue", "-c", str(config), "render", "--tenant", "acme").output.strip()
    dry = run("cancel", "-c", str(config), "--tenant", "acme")
    assert f"would cancel 1 job(s) matching tenant=acme: {jid}" in dry.output
    assert "--yes" in dry.output
    assert json.loads(run("jobs", "-c", str(config), "--json").output)["state"] == "queued"
    done = run("cancel", "-c", str(config), "--tenant", "acme", "--yes")
    assert done.output.strip() == f"cancelled 1 queued job(s): {jid}"
    job = json.loads(run("jobs", "-c", str(config), "--json", "--state", "cancelled").output)
    assert job["state"] == "cancelled" and job["finished_at"].endswith("Z")
    for args, text in (
        (["cancel", "-c", str(config)], "IDS or a filter"),
        (["cancel", "-c", str(config), jid, "--kind", "render"], "not both"),
        (["cancel", "-c", str(config), "999"], "no job with id 999"),
        (["pause", "-c", str(config), "bulkk"], "no pool 'bulkk'"),
        (["pause", "-c", str(config), "bulk", "--kind", "nope"], "no kind 'nope'"),
    ):
        out = CliRunner().invoke(main, args)
        assert out.exit_code == 2 and text in out.output, (args, out.output)
    assert "paused pool bulk fleet-wide" in run("pause", "-c", str(config), "bulk").output
    assert "paused already" in run("pause", "-c", str(config), "bulk").output
    status = json.loads(run("status", "-c", str(config), "--json").output)
    assert status["pools"]["bulk"]["paused"] is True and status["pools"]["bulk"]["paused_since"]
    assert "resumed pool bulk" in run("resume", "-c", str(config), "bulk").output
    assert "was not paused" in run("resume", "-c", str(config), "bulk").output


def test_resume_of_a_kind_under_a_paused_pool_says_the_pool_still_holds_it(config):
    run("pause", "-c", str(config), "bulk")
    out = run("resume", "-c", str(config), "bulk", "--kind", "render").output
    assert "no pause of its own" in out and "paused as a whole" in out, out
    run("pause", "-c", str(config), "bulk", "--kind", "render")
    out = run("resume", "-c", str(config), "bulk", "--kind", "render").output
    assert "resumed kind render of pool bulk" in out and "still paused as a whole" in out, out
    assert "resumed pool bulk" in run("resume", "-c", str(config), "bulk").output
    run("pause", "-c", str(config), "bulk", "--kind", "render")
    out = run("resume", "-c", str(config), "bulk", "--kind", "render").output
    assert "its jobs start again" in out and "whole" not in out, out


def test_enqueue_wait_refuses_a_bad_timeout_and_writes_nothing(config, db_url):
    for args, says in (
        (["--wait", "--timeout", "soon"], "--timeout"),
        (["--wait", "--timeout", "0s"], "must be more than 0"),
        (["--timeout", "5s"], "--timeout goes with --wait"),
    ):
        out = CliRunner().invoke(main, ["enqueue", "-c", str(config), "render", *args])
        assert out.exit_code == 2 and says in out.output, out.output
    store = open_store(db_url)
    try:
        assert store.list_jobs() == []
    finally:
        store.close()


@pytest.mark.parametrize(
    "command",
    [["check"], ["start"], ["enqueue", "a"], ["jobs"], ["status", "--once"], ["dlq", "list"]],
)
def test_slots_on_a_cpu_pool_exit_2_from_every_command(tmp_path, command):
    bad = tmp_path / "fleet.toml"
    bad.write_text(
        f'[fleet]\ndatabase = "sqlite:///{tmp_path}/x.db"\n'
        '[pools.p]\nhandlers = { a = "m:f" }\nslots = 8\n'
    )
    out = CliRunner().invoke(main, [*command, "-c", str(bad)])
    assert out.exit_code == 2, out.output
    line = f'{bad}: pools.p.slots: 8 needs bound = "io" (a cpu pool runs one job per worker)'
    assert out.output.strip().endswith(line)
    assert len(out.output.strip().splitlines()) == 1
    assert not (tmp_path / "x.db").exists()  # nothing written
