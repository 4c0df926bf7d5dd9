"""``python -m stress bench`` without running it: the --peers option, a missing peer shown as
"not installed" (never an ImportError), and the marker-file reading every figure rests on.
The bench itself is for people; nothing here starts a queue."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pytest

from stress import bench_peers
from stress.bench_peers import Marks, executions, summary_table
from stress.peers import PEERS, PeerSpec, short_error, tasks


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench_peers.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_peers_option_defaults_to_every_peer_and_rejects_unknown_names(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert parse().peers == list(PEERS)
    assert parse("--peers", "celery, rq").peers == ["celery", "rq"]
    with pytest.raises(SystemExit):
        parse("--peers", "celery,sidekiq")
    assert "unknown peer sidekiq" in capsys.readouterr().err


def test_a_missing_distribution_is_not_installed_and_shown_so() -> None:
    missing = PeerSpec("ghost", "stress.peers.no_such_module", "Nope", ("no-such-dist-x9",))
    assert missing.version() is None  # found from metadata, the module is never imported
    assert PEERS["fleetd"].version()  # this project itself is always installed
    results = {"throughput": {}, "cpu": {}, "pickup": {}}
    table = summary_table(["ghost"], {"ghost": None}, results)
    assert list(table.columns[1].cells) == ["not installed"]


def test_marks_are_read_incrementally_and_split_into_executions(tmp_path: Path) -> None:
    marker = str(tmp_path / "marker")
    marks = Marks(marker)
    assert marks.count() == 0  # no file yet
    tasks.mark(marker, "start", "hang")
    tasks.mark(marker, "beat", "hang")
    with open(marker, "a") as f:
        f.write(f"beat hang 1 {time.time()}")  # a line being written waits for the next poll
    assert [m.event for m in marks.poll()] == ["start", "beat"]
    with open(marker, "a") as f:
        f.write("\n")
    tasks.mark(marker, "start", "hang")  # a second delivery
    tasks.mark(marker, "mem", "bomb:50")
    assert marks.count() == 5
    runs = executions(marks, "hang")
    assert [[m.event for m in run] for run in runs] == [["start", "beat", "beat"], ["start"]]
    assert [m.tag for m in marks.tagged("bomb")] == ["bomb:50"]


def test_short_error_drops_the_module_and_cuts_the_message() -> None:
    text = short_error("rq.timeouts.JobTimeoutException: Task exceeded maximum timeout value")
    assert text.startswith("JobTimeoutException: Task exceeded")
    assert len(short_error("x" * 200)) == 60


def test_bench_worker_runs_every_job_through_a_real_worker() -> None:
    from stress import bench_worker

    rate, cost = bench_worker._round(3000)  # raises if the worker exits or a result is missing
    assert rate > 0
    assert 0 < cost < 0.01  # CPU seconds a no-op job: some, and far less than 10 ms
