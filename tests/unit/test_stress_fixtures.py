"""The stress fixtures outside a worker: the execution-log line, flaky's attempts, the
downstream semaphore, and the fork bomb's refusal to run where RLIMIT_NPROC cannot bind it."""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stress import fixtures
from workers import Permanent
from workers.context import JobContext, bind, unbind


@pytest.fixture
def as_job() -> Iterator[None]:
    token = bind(JobContext(id=42, kind="flaky", attempt=2, deadline=time.time() + 60, pool="p"))
    yield
    unbind(token)


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_each_execution_appends_one_line_with_its_job(tmp_path: Path, as_job: None) -> None:
    log = tmp_path / "runs.jsonl"
    fixtures.noop({"log": str(log)})
    fixtures.burn({"log": str(log), "ms": 1})
    first, second = lines(log)
    assert first["job"] == 42 and first["attempt"] == 2 and first["kind"] == "flaky"
    assert first["pid"] == os.getpid() and first["ppid"] == os.getppid()
    assert first["outcome"] == "ok" and first["start"] <= first["end"]
    assert second["end"] - second["start"] >= 0.001


def test_outside_a_job_the_line_has_no_job(tmp_path: Path) -> None:
    log = tmp_path / "runs.jsonl"
    fixtures.noop({"log": str(log)})
    assert lines(log)[0]["job"] is None


def test_flaky_raises_until_its_attempt(tmp_path: Path, as_job: None) -> None:
    log = tmp_path / "runs.jsonl"
    with pytest.raises(RuntimeError, match="attempt 2 < 3"):
        fixtures.flaky({"log": str(log), "succeed_on": 3})
    assert fixtures.flaky({"log": str(log), "succeed_on": 2}) == {"attempt": 2}
    assert [r["outcome"] for r in lines(log)] == ["raised", "ok"]
    assert lines(log)[0]["error"] == "RuntimeError"


def test_downstream_waits_for_a_free_slot(tmp_path: Path) -> None:
    log = tmp_path / "runs.jsonl"
    held = os.open(tmp_path / "slot-0", os.O_RDWR | os.O_CREAT)
    fcntl.flock(held, fcntl.LOCK_EX)
    releaser = threading.Timer(0.2, lambda: fcntl.flock(held, fcntl.LOCK_UN))
    releaser.start()
    try:
        fixtures.downstream(
            {"log": str(log), "seconds": 0.01, "slots": 1, "lock_dir": str(tmp_path)}
        )
    finally:
        releaser.join()
        os.close(held)
    (run,) = lines(log)
    assert run["slot"] == 0 and 0.15 <= run["waited"] < 2.0

    fixtures.downstream({"log": str(log), "seconds": 0.01, "slots": 2, "lock_dir": str(tmp_path)})
    assert lines(log)[1]["waited"] < 0.05


@pytest.mark.skipif(os.geteuid() != 0, reason="the refusal tested here is root's")
def test_the_fork_bomb_refuses_to_run_as_root(tmp_path: Path) -> None:
    log = tmp_path / "runs.jsonl"
    with pytest.raises(Permanent, match="fork_bomb refused"):
        fixtures.fork_bomb({"log": str(log)})
    assert not log.exists()  # refused before it recorded (or forked) anything
