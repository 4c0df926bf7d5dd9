"""A real supervisor seen from outside: /metrics after a small workload, /healthz catching a
wedged worker (busy past its deadline with a kill that does not work; idle and stopped) and
recovering once it is gone, ``fleetd check --live``, ``fleetd status --json`` against its
schema, and JSON log lines."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import jsonschema
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from supervisor.observe import metrics
from supervisor.observe.fleetview import GONE_AFTER, node_view
from tests.integration.fleet import REPO, Harness, handlers
from tests.support.wait import eventually

SCHEMA = json.loads((REPO / "docs" / "status.schema.json").read_text())
ISSUE_METRICS = (
    "fleetd_oldest_job_age_seconds",
    "fleetd_backlog_jobs",
    "fleetd_jobs_enqueued_total",
    "fleetd_jobs_finished_total",
    "fleetd_job_duration_seconds",
    "fleetd_job_peak_rss_bytes",
    "fleetd_lease_expiries_total",
    "fleetd_redeliveries_total",
    "fleetd_lease_releases_total",
    "fleetd_workers",
    "fleetd_desired_workers",
    "fleetd_pool_ceiling",
    "fleetd_pool_saturated",
    "fleetd_dead_letters_total",
    "fleetd_worker_kills_total",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, text = get(port, "/metrics")
    assert status == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), float("nan"))


def fleetd(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "supervisor", *args, "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


WORK = {
    "handlers": handlers("echo", "boom", "hang", "sleep", "hang_past_the_alarm"),
    "min_workers": 2,
    "max_workers": 2,
    "lease": "2s",
    "timeout": "1s",
    "max_deliveries": 2,
    "retry_backoff": "100ms",
}


def test_metrics_after_a_small_workload(fleet: Harness) -> None:
    port = free_port()
    # pipeline 1: no job waits behind another in a worker (one sent behind the hang in its
    # first 50 ms would come back, released, when the hang's worker is killed)
    fleet.configure({"work": {**WORK, "pipeline": 1}}, metrics=f"127.0.0.1:{port}")
    ghost = fleet.enqueue("echo", {"ghost": True})
    [claimed] = fleet.store.claim(pool="work", kinds={"echo"}, n=1, node="ghost", lease=0.5)
    assert claimed.job_id == ghost  # a lease nobody extends: the reaper must return it
    sup = fleet.start()
    ids = [fleet.enqueue("echo", {"i": i}) for i in range(5)]
    ids += [fleet.enqueue("boom"), fleet.enqueue("hang")]
    jobs = fleet.wait_final([ghost, *ids], timeout=30, watch=[sup])
    assert [j.state for j in jobs].count("done") == 6

    def settled() -> dict | None:
        s = scrape(port)
        done = value(s, "fleetd_jobs_finished_total", pool="work", outcome="done")
        dead = value(s, "fleetd_dead_letters_total", pool="work", error_kind="timeout")
        idle = value(s, "fleetd_workers", pool="work", state="idle")  # the killed ones replaced
        return s if (done, dead, idle) == (6, 1, 2) else None

    s = eventually(settled, timeout=10)
    names = {name for name, _ in s}
    for name in ISSUE_METRICS:
        assert name in names or f"{name}_count" in names, name
    assert value(s, "fleetd_jobs_enqueued_total", pool="work") == 7  # the ghost came before
    assert value(s, "fleetd_jobs_finished_total", pool="work", outcome="exception") == 2
    assert value(s, "fleetd_jobs_finished_total", pool="work", outcome="timeout") == 2
    assert value(s, "fleetd_dead_letters_total", pool="work", error_kind="exception") == 1
    assert value(s, "fleetd_worker_kills_total", pool="work", reason="timeout") == 2
    assert value(s, "fleetd_lease_expiries_total") >= 1
    assert value(s, "fleetd_redeliveries_total", pool="work") >= 3  # ghost, boom, hang
    assert value(s, "fleetd_lease_releases_total") == 0
    assert value(s, "fleetd_backlog_jobs", pool="work") == 0
    assert value(s, "fleetd_oldest_job_age_seconds", pool="work") == 0
    assert value(s, "fleetd_job_duration_seconds_count", pool="work") == 10
    assert value(s, "fleetd_job_duration_seconds_sum", pool="work") > 2.0  # two 1 s timeouts
    assert value(s, "fleetd_job_peak_rss_bytes_count", pool="work") == 10
    assert value(s, "fleetd_job_peak_rss_bytes_sum", pool="work") > 10 * 1024 * 1024
    workers = sum(value(s, "fleetd_workers", pool="work", state=st) for st in ("busy", "idle"))
    assert workers == 2
    assert value(s, "fleetd_desired_workers", pool="work") >= 0
    assert value(s, "fleetd_pool_ceiling", pool="work") >= 1
    assert value(s, "fleetd_pool_saturated", pool="work") == 0
    assert value(s, "fleetd_healthy") == 1
    assert f"job {ghost} echo (pool work) attempt 1/2 lease_expired" in sup.log()
    # served from the loop: the supervisor runs one thread, and no worker holds the port
    assert psutil.Process(sup.pid).num_threads() == 1
    for child in sup.track():
        assert all(c.laddr.port != port for c in child.net_connections(kind="inet")), child
    assert names <= {n for m in metrics.METRICS for n in (m.name, *_hist(m))}


def _hist(m: metrics.MetricDef) -> tuple[str, ...]:
    if m.kind != "histogram":
        return ()
    return tuple(m.name + suffix for suffix in ("_bucket", "_count", "_sum"))


@pytest.mark.parametrize("engine", ["sqlite"])
def test_healthz_catches_a_busy_worker_whose_kill_did_not_work(fleet: Harness) -> None:
    port = free_port()
    # one delivery: the job is not run again on a fresh worker that would be wedged the same way
    work = {**WORK, "min_workers": 1, "max_workers": 1, "lease": "3s", "max_deliveries": 1}
    config = fleet.configure({"work": work}, metrics=f"127.0.0.1:{port}")
    sup = fleet.start(hooks=["--no-kill", "timeout"])  # the deadline kill is not sent
    eventually(lambda: get(port, "/healthz")[0] == 200, timeout=10)
    job = fleet.enqueue("hang_past_the_alarm")  # and the worker's own alarm is ignored

    def unhealthy() -> dict | None:
        status, body = get(port, "/healthz")
        return json.loads(body) if status == 503 else None

    body = eventually(unhealthy, timeout=15)
    [problem] = [p for p in body["problems"] if p["pool"] == "work"][:1]
    assert problem["worker"] == "work#1" and problem["reason"] in ("kill_failed", "wedged_busy")
    assert problem["pid"] > 0 and problem["detail"]

    live = fleetd(config, "check", "--live")
    assert live.returncode == 1, live.stdout + live.stderr
    assert "work#1" in live.stdout

    os.kill(problem["pid"], signal.SIGKILL)  # what the watchdog's kill should have done
    eventually(lambda: get(port, "/healthz")[0] == 200, timeout=10)
    assert fleet.wait_final([job])[0].state == "dead"
    assert fleetd(config, "check", "--live").returncode == 0
    sup.check_alive()


@pytest.mark.parametrize("engine", ["sqlite"])
def test_healthz_catches_an_idle_worker_that_does_not_answer_a_ping(fleet: Harness) -> None:
    port = free_port()
    work = {**WORK, "min_workers": 1, "max_workers": 1, "lease": "3s"}  # ping every 1 s
    fleet.configure({"work": work}, metrics=f"127.0.0.1:{port}")
    sup = fleet.start()
    sup.wait_workers(fleet.store, "work", 1, "idle")
    [pid] = [w["pid"] for w in sup.workers(fleet.store, "work")]
    eventually(lambda: get(port, "/healthz")[0] == 200, timeout=10)
    os.kill(pid, signal.SIGSTOP)
    try:

        def unhealthy() -> dict | None:
            status, body = get(port, "/healthz")
            return json.loads(body) if status == 503 else None

        body = eventually(unhealthy, timeout=10)
        [problem] = body["problems"]
        assert (problem["reason"], problem["worker"], problem["pid"]) == (
            "ping_unanswered",
            "work#1",
            pid,
        )
    finally:
        os.kill(pid, signal.SIGCONT)
    eventually(lambda: get(port, "/healthz")[0] == 200, timeout=10)
    assert [w["pid"] for w in sup.workers(fleet.store, "work")] == [pid]  # answered: kept


@pytest.mark.parametrize("engine", ["sqlite"])
def test_status_json_from_a_running_fleet_matches_the_schema(fleet: Harness) -> None:
    config = fleet.configure({"work": {**WORK, "timeout": "60s"}}, log_format="json")
    sup = fleet.start()
    sup.wait_workers(fleet.store, "work", 2, "idle")
    for _ in range(3):  # two run, one waits (or is prefetched) while we look
        fleet.enqueue("sleep", {"seconds": 10})
    sup.wait_workers(fleet.store, "work", 2, "busy")
    boom = fleet.enqueue("boom")

    out = fleetd(config, "status", "--json")
    assert out.returncode == 0, out.stderr
    document = json.loads(out.stdout)
    jsonschema.validate(document, SCHEMA)
    work = document["pools"]["work"]
    assert (work["busy"], work["nodes"], work["kinds"]) == (2, 1, list(WORK["handlers"]))
    assert work["ready"] + work["leased"] >= 3  # the sleeps: running, prefetched or waiting
    [node] = [n for n in document["nodes"] if n["status"] == "running"]
    assert node["node_id"] == sup.node_id and node["snapshot"]["pid"] == sup.pid

    once = fleetd(config, "status", "--once")
    assert once.returncode == 0 and "work" in once.stdout and sup.node_id in once.stdout

    fleet.wait_final([boom], timeout=60, watch=[sup])  # it runs once a sleep is over
    events = [json.loads(line) for line in sup.log().splitlines() if line.startswith("{")]
    failed = [e for e in events if e.get("event") == "job_failed" and e["job_id"] == boom]
    assert failed and failed[0]["error_kind"] == "exception" and failed[0]["pool"] == "work"
    assert {"kind", "attempt", "duration", "peak_rss"} <= set(failed[0])
    dead = [e for e in events if e.get("event") == "job_dead" and e["job_id"] == boom]
    assert dead and dead[0]["attempt"] == 2


@pytest.mark.parametrize("engine", ["sqlite"])
def test_a_taken_metrics_port_stops_the_start(fleet: Harness) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = fleet.configure({"work": WORK}, metrics=f"127.0.0.1:{port}")
        out = fleetd(config, "start")
    assert out.returncode == 2
    assert f"metrics: cannot listen on 127.0.0.1:{port}" in out.stderr


@pytest.mark.parametrize("engine", ["sqlite"])
def test_a_supervisor_killed_with_sigkill_is_shown_gone_not_healthy(fleet: Harness) -> None:
    config = fleet.configure({"work": {**WORK, "min_workers": 1, "max_workers": 1}})
    a, b = fleet.start("node-a"), fleet.start("node-b")
    a.wait_workers(fleet.store, "work", 1)
    b.wait_workers(fleet.store, "work", 1)
    b.signal(signal.SIGKILL)  # no drain, no "stopped" row: the heartbeat just ends
    b.wait_exit(5)

    def gone() -> bool:
        rows = {r["node_id"]: node_view(r) for r in fleet.store.list_nodes()}
        return rows["node-b"].status == "gone"

    eventually(gone, timeout=GONE_AFTER + 10)
    out = fleetd(config, "status", "--json")
    document = json.loads(out.stdout)
    jsonschema.validate(document, SCHEMA)
    status = {n["node_id"]: n["status"] for n in document["nodes"]}
    assert status == {"node-a": "running", "node-b": "gone"}
    assert not document["health"]["healthy"]
    assert [(p["node"], p["reason"]) for p in document["health"]["problems"]] == [
        ("node-b", "node_gone")
    ]
    assert "GONE" in fleetd(config, "status", "--once").stdout
    live = fleetd(config, "check", "--live")
    assert live.returncode == 1 and "node_gone: node-b" in live.stdout
    a.check_alive()
