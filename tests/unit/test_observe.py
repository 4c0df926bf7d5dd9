"""The observe/ wing without processes: health verdicts, windows, the metrics collector, the
status screen (captured with a recording console) and the --json schema."""

from __future__ import annotations

import io
import json
import logging
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from supervisor.model import PoolStats
from supervisor.observe import health, metrics, status_view
from supervisor.observe.fleetview import GONE_AFTER, build_view
from supervisor.observe.logs import JsonFormatter, job_event
from supervisor.observe.recorder import JobRecorder, Series, quantile
from supervisor.observe.snapshot import FleetSnapshot, PoolView, WorkerView

ROOT = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024
SCHEMA = json.loads((ROOT / "docs" / "status.schema.json").read_text())


# ---- fixtures: a fabricated fleet ---------------------------------------------------------


def worker(pool: str, slot: int, state: str = "idle", **kw) -> WorkerView:
    base = {"pid": 1000 + slot, "timeout": 10.0, "rss": 40 * MIB, "age": 60.0}
    if state == "busy":
        base |= {"job": 100 + slot, "kind": "render", "attempt": 1, "elapsed": 2.0}
    return WorkerView(pool=pool, slot=slot, state=state, **(base | kw))


def pool(name: str = "bulk", workers: tuple[WorkerView, ...] = (), **kw) -> PoolView:
    base = dict(
        kinds=("render",),
        target=len(workers),
        desired=len(workers),
        ceiling=8,
        binding="cpu",
        min_workers=1,
        max_workers=8,
        timeout=10.0,
        memory_limit=256 * MIB,
        latency_target=300.0,
        ping_timeout=2.0,
        progress_window=30.0,
        ready=0,
        scheduled=0,
        leased=sum(w.state == "busy" for w in workers),
        dead=0,
        finished={"done": 40, "exception": 2},
        dead_letters={"exception": 1},
        kills={"memory_limit": 1},
        enqueued=45,
        redeliveries=2,
    )
    return PoolView(name=name, workers=workers, **(base | kw))


def snapshot(*pools: PoolView, node: str = "node-a", **kw) -> FleetSnapshot:
    return FleetSnapshot(
        node_id=node,
        hostname=kw.pop("hostname", "host-a"),
        pid=kw.pop("pid", 4242),
        fleet="demo",
        taken_at=1_800_000_000.0,
        started_at=1_799_999_000.0,
        pools={p.name: p for p in pools},
        **kw,
    )


def row(snap: FleetSnapshot | None, age: float = 0.5, state: str = "running", **kw) -> dict:
    return {
        "node_id": kw.get("node_id", snap.node_id if snap else "node-x"),
        "hostname": snap.hostname if snap else "host-x",
        "pid": snap.pid if snap else 1,
        "fleet": "demo",
        "started_at": 1_799_999_000.0,
        "heartbeat_at": 1_800_000_000.0 - age,
        "state": state,
        "snapshot": snap.to_json() if snap else None,
        "age": age,
    }


class _Cfg:
    def __init__(self, name: str, memory_limit: int | None = 256 * MIB) -> None:
        self.name, self.handlers, self.memory_limit = name, {"render": "x:y"}, memory_limit
        self.latency_target, self.timeout = 300.0, 10.0


def view(*rows: dict, stats: dict | None = None, pools: tuple[str, ...] = ("bulk",)):
    return build_view(
        fleet="demo",
        database="sqlite:///demo.db",
        configured={p: _Cfg(p) for p in pools},
        stats=stats if stats is not None else {p: PoolStats(p) for p in pools},
        rows=rows,
        now=1_800_000_000.0,
    )


# ---- health -------------------------------------------------------------------------------


def test_a_quiet_supervisor_is_healthy() -> None:
    snap = snapshot(pool(workers=(worker("bulk", 1), worker("bulk", 2, "busy"))))
    assert health.judge(snap) == health.Verdict(True)


@pytest.mark.parametrize(
    ("w", "reason"),
    [
        (worker("bulk", 1, "busy", elapsed=12.5), "wedged_busy"),  # timeout 10 + grace 2
        (worker("bulk", 1, "stopping", kill="timeout", killed_for=3.0), "kill_failed"),
        (worker("bulk", 1, "idle", ping_wait=2.5), "ping_unanswered"),
        (worker("bulk", 1, "busy", ping_wait=2.5), "ping_unanswered"),
        (worker("bulk", 1, "starting", age=31.0), "stuck_starting"),
    ],
)
def test_wedged_workers_are_named_with_the_reason(w: WorkerView, reason: str) -> None:
    verdict = health.judge(snapshot(pool(workers=(w,))))
    assert not verdict.healthy
    [problem] = verdict.problems
    assert (problem.reason, problem.pool, problem.worker, problem.pid) == (
        reason,
        "bulk",
        "bulk#1",
        w.pid,
    )
    assert problem.detail


@pytest.mark.parametrize(
    "w",
    [
        worker("bulk", 1, "busy", elapsed=11.9),  # past the timeout but within the kill grace
        worker("bulk", 1, "stopping", kill="timeout", killed_for=1.0),
        worker("bulk", 1, "idle", ping_wait=1.5),
        worker("bulk", 1, "starting", age=5.0),
    ],
)
def test_workers_within_their_grace_are_not_wedged(w: WorkerView) -> None:
    assert health.judge(snapshot(pool(workers=(w,)))).healthy


def test_the_soft_timeout_window_is_not_wedged() -> None:
    w = worker("bulk", 1, "busy", elapsed=14.0)
    assert health.judge(snapshot(pool(workers=(w,), soft_timeout=5.0))).healthy


def test_a_pool_with_ready_work_and_no_progress_is_stalled_unless_draining() -> None:
    stalled = pool(ready=12, oldest_age=45.0, stalled_for=45.0)
    verdict = health.judge(snapshot(stalled))
    assert [p.reason for p in verdict.problems] == ["pool_stalled"]
    assert "12 ready" in verdict.problems[0].detail
    assert health.judge(snapshot(stalled, state="draining")).healthy
    assert health.judge(snapshot(replace(stalled, stalled_for=20.0))).healthy


def test_an_old_snapshot_means_a_stuck_loop() -> None:
    verdict = health.judge(snapshot(pool()), age=health.LOOP_STALE + 1)
    assert [p.reason for p in verdict.problems] == ["loop_stalled"]


# ---- windows and quantiles ----------------------------------------------------------------


def test_quantiles_cover_only_the_recent_window() -> None:
    rec = JobRecorder()
    rec.record("bulk", 100.0, 900 * MIB, at=0.0)  # too old
    for i in range(1, 21):
        rec.record("bulk", float(i), i * MIB, at=1000.0)
    assert rec.quantiles("bulk", now=1000.0, window=300.0) == (10.0, 19.0, 19 * MIB)
    assert rec.pool("bulk").duration.count == 21  # the histogram keeps everything
    assert quantile([], 0.5) is None


def test_series_rates_and_deltas() -> None:
    s = Series(keep=400)
    for t in range(0, 121, 10):
        s.add(float(t), {"done": t * 2.0})
    assert s.rate("done", now=120.0, window=60.0) == pytest.approx(2.0)
    assert s.delta("done", now=120.0, window=60.0) == pytest.approx(120.0)
    assert s.delta("done", now=120.0, window=1000.0) == pytest.approx(240.0)
    assert s.delta("missing", now=120.0, window=60.0) == 0.0


# ---- metrics ------------------------------------------------------------------------------

REQUIRED = {
    "fleetd_oldest_job_age_seconds": {"pool"},
    "fleetd_backlog_jobs": {"pool"},
    "fleetd_jobs_enqueued_total": set(),
    "fleetd_jobs_finished_total": {"pool", "outcome"},
    "fleetd_job_duration_seconds": set(),
    "fleetd_job_peak_rss_bytes": set(),
    "fleetd_lease_expiries_total": set(),
    "fleetd_redeliveries_total": set(),
    "fleetd_lease_releases_total": set(),
    "fleetd_workers": {"pool", "state"},
    "fleetd_desired_workers": {"pool"},
    "fleetd_pool_ceiling": {"pool"},
    "fleetd_pool_saturated": {"pool"},
    "fleetd_dead_letters_total": {"pool", "error_kind"},
    "fleetd_worker_kills_total": {"pool", "reason"},
}


def scrape(snap: FleetSnapshot) -> dict[str, list]:
    text = metrics.render(metrics.make_registry(lambda: snap)).decode()
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, []).append(s)
    return samples


def test_every_metric_the_issue_names_is_exported_with_its_labels() -> None:
    w = (worker("bulk", 1, "busy"), worker("bulk", 2))
    samples = scrape(snapshot(pool(workers=w, ready=7, oldest_age=12.5), lease_expiries=3))
    for name, labels in REQUIRED.items():
        assert name in metrics.NAMES
        found = samples.get(name) or samples.get(name + "_count")
        assert found, f"{name} missing"
        assert labels <= set(found[0].labels), (name, found[0].labels)
    one = {s.name: s.value for s in samples["fleetd_backlog_jobs"]}
    assert one == {"fleetd_backlog_jobs": 7.0}
    assert samples["fleetd_oldest_job_age_seconds"][0].value == 12.5
    assert samples["fleetd_lease_expiries_total"][0].value == 3.0
    busy = [s for s in samples["fleetd_workers"] if s.labels["state"] == "busy"]
    assert busy[0].value == 1.0
    outcomes = {s.labels["outcome"]: s.value for s in samples["fleetd_jobs_finished_total"]}
    assert outcomes["done"] == 40 and outcomes["exception"] == 2 and outcomes["timeout"] == 0


def test_metrics_are_empty_before_the_first_snapshot() -> None:
    assert metrics.render(metrics.make_registry(lambda: None)) == b""


# ---- the status screen --------------------------------------------------------------------


def busy_fleet(n_workers: int = 3, gone: bool = True):
    bomb = worker("poison", 1, "busy", kind="parse_upload", rss=241 * MIB, elapsed=1.2)
    poison = pool(
        "poison", (bomb,), ready=3, oldest_age=200.0, memory_limit=256 * MIB, saturated=True
    )
    bulk_workers = tuple(
        worker("bulk", i, "busy" if i % 2 else "idle") for i in range(1, n_workers + 1)
    )
    bulk = pool(
        "bulk",
        bulk_workers,
        ready=120,
        oldest_age=20.0,
        arrival_rate=3.2,
        throughput=2.9,
        duration_p50=0.8,
        duration_p95=2.1,
        peak_rss_p95=180 * MIB,
        recent={"redeliveries": 2, "failures": 3, "dead_letters": 1, "kills": 1},
    )
    rows = [row(snapshot(bulk, poison, recent_lease_expiries=2))]
    if gone:
        rows.append(row(snapshot(pool("bulk"), node="node-b", hostname="host-b"), age=95.0))
    stats = {
        "bulk": PoolStats("bulk", ready=120, oldest_ready_age=20.0),
        "poison": PoolStats("poison", ready=10_000, oldest_ready_age=200.0, capped=True),
    }
    return view(*rows, stats=stats, pools=("bulk", "poison"))


def capture(v, width: int, height: int | None = None) -> str:
    console = Console(record=True, width=width, file=io.StringIO(), color_system=None)
    console.print(status_view.render(v, width, height))
    return console.export_text()


@pytest.mark.parametrize("width", [80, 160])
def test_the_status_screen_fits_its_width_and_says_what_matters(width: int) -> None:
    text = capture(busy_fleet(), width)
    lines = text.splitlines()
    assert all(len(line) <= width for line in lines), text
    for needle in (
        "2 leases reaped",
        "bulk",
        "poison",
        "SATURATED",
        "node-b",
        "GONE",
        "parse_upload",
        "241M/256M",
        "host-a",
        "problem",
    ):
        if needle == "host-a" and width < status_view.WIDE:
            continue  # one live host: no host column at 80 columns
        assert needle in text, (needle, text)
    assert "healthy" not in lines[0]  # a gone node is never shown as healthy
    assert ("backlog 10000+" if width < status_view.WIDE else "10000+") in text  # "at least"


def test_many_workers_collapse_to_fit_the_height() -> None:
    text = capture(busy_fleet(n_workers=60, gone=False), 80, height=24)
    lines = text.splitlines()
    assert len(lines) <= 24, text
    assert "more workers" in lines[-1]
    assert "parse_upload" in text  # the worker near its memory limit is kept


def test_the_status_json_matches_its_schema() -> None:
    document = json.loads(json.dumps(busy_fleet().to_dict()))  # as the CLI prints it
    jsonschema.validate(document, SCHEMA)
    assert document["pools"]["bulk"]["ready"] == 120
    assert document["pools"]["poison"]["counts_capped"] is True
    gone = [n for n in document["nodes"] if n["status"] == "gone"]
    assert [n["node_id"] for n in gone] == ["node-b"]
    assert not document["health"]["healthy"]


def test_nodes_without_a_heartbeat_are_gone_and_old_stopped_ones_hidden() -> None:
    v = view(
        row(snapshot(pool()), age=GONE_AFTER + 1),
        row(None, age=5000.0, state="stopped", node_id="old"),
        row(None, age=3.0, state="stopped", node_id="recent"),
    )
    assert [(n.node_id, n.status) for n in v.nodes] == [("node-a", "gone"), ("recent", "stopped")]
    assert v.hidden_nodes == 1
    assert [p.reason for p in v.verdict.problems] == ["node_gone", "no_live_node"]


def test_ready_work_with_no_live_node_is_flagged() -> None:
    v = view(stats={"bulk": PoolStats("bulk", ready=5, oldest_ready_age=50.0)})
    assert [p.reason for p in v.verdict.problems] == ["no_live_node", "pool_unserved"]


def test_a_fleet_with_no_live_supervisor_is_unhealthy_even_with_nothing_queued() -> None:
    stopped = view(row(None, age=3.0, state="stopped"))
    assert [p.reason for p in stopped.verdict.problems] == ["no_live_node"]
    assert not view().verdict.healthy  # no node ever started
    assert view(row(snapshot(pool()), age=1.0)).verdict.healthy
    # registered, first snapshot not yet written (or unreadable): running, so not "none live"
    assert "no_live_node" not in [p.reason for p in view(row(None, age=1.0)).verdict.problems]


# ---- logs ---------------------------------------------------------------------------------


def test_job_outcomes_log_as_json_with_their_fields() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    log = logging.getLogger("fleetd.test.observe")
    log.addHandler(handler)
    log.propagate = False
    try:
        job_event(
            log,
            logging.WARNING,
            "job_dead",
            job_id=7,
            pool="poison",
            kind="parse",
            attempt=2,
            max_deliveries=2,
            duration=0.25,
            peak_rss=300 * MIB,
            error_kind="memory_limit",
            message="worker RSS passed memory_limit",
        )
    finally:
        log.removeHandler(handler)
    line = json.loads(stream.getvalue())
    assert line["event"] == "job_dead" and line["level"] == "WARNING"
    assert (line["job_id"], line["pool"], line["kind"], line["attempt"]) == (
        7,
        "poison",
        "parse",
        2,
    )
    assert (line["duration"], line["peak_rss"], line["error_kind"]) == (
        0.25,
        300 * MIB,
        "memory_limit",
    )
    assert "job 7 parse (pool poison) attempt 2/2 dead" in line["msg"]
    assert line["ts"].endswith("Z")


def test_a_running_jobs_elapsed_time_counts_the_snapshots_age() -> None:
    busy, idle = worker("bulk", 1, "busy"), worker("bulk", 2)
    v = view(row(snapshot(pool(workers=(busy, idle))), age=0.8))
    shown = {r.worker.slot: r.worker.elapsed for r in v.workers}
    assert shown == {1: pytest.approx(2.8), 2: None}  # 2.0 s when the node wrote it


def test_the_view_shows_a_paused_pool_and_cancelled_jobs() -> None:
    from types import SimpleNamespace

    from rich.console import Console

    from supervisor.model import Pause, PoolStats
    from supervisor.observe.fleetview import build_view
    from supervisor.observe.status_view import render

    config = SimpleNamespace(
        handlers={"render": "m:f", "thumb": "m:g"},
        latency_target=300.0,
        memory_limit=None,
        timeout=60.0,
    )

    def view(pauses: list[Pause]):
        return build_view(
            fleet="f",
            database="sqlite:///x",
            configured={"bulk": config},
            stats={"bulk": PoolStats("bulk", ready=5, cancelled=3)},
            rows=[],
            now=1_800_000_000.0,
            pauses=pauses,
        )

    whole = view([Pause("bulk", None, 1_799_999_000.0)]).pools[0]
    assert whole.paused and whole.paused_kinds == () and whole.cancelled == 3
    assert whole.paused_since == "2027-01-15T07:43:20Z"
    one = view([Pause("bulk", "thumb", 1_799_999_000.0)]).pools[0]
    assert not one.paused and one.paused_kinds == ("thumb",)
    both = view([Pause("bulk", "thumb", 1.0), Pause("bulk", "render", 2.0)]).pools[0]
    assert both.paused  # every kind of it: the pool is paused
    console = Console(record=True, width=80)
    console.print(render(view([Pause("bulk", None, 1_799_999_000.0)]), 80, 24))
    text = console.export_text()
    assert "PAUSED" in text and "3 cancelled" in text and "fleetd resume" in text


# ---- slots: concurrency counts jobs ---------------------------------------------------------


def test_jobs_running_count_slots_not_workers() -> None:
    w = (
        worker("bulk", 1, "busy", running=20, slots=20),
        worker("bulk", 2, "busy", running=15, slots=20),
        worker("bulk", 3, "idle", slots=20),
    )
    snap = snapshot(pool(workers=w, slots=20))
    assert snap.pools["bulk"].running == 35
    samples = scrape(snap)
    assert [s.value for s in samples["fleetd_jobs_running"]] == [35.0]
    busy = [s for s in samples["fleetd_workers"] if s.labels["state"] == "busy"]
    assert busy[0].value == 2.0  # processes, beside the jobs
    back = FleetSnapshot.from_json(snap.to_json())  # the node row keeps them
    assert back.pools["bulk"].running == 35 and back.pools["bulk"].slots == 20
    text = capture(view(row(snap)), 160)
    assert "2 busy 1 idle /3 · 35/60 slots" in text, text


# ---- rate limits --------------------------------------------------------------------------


def rate_held_fleet():
    api = pool(
        "api",
        (worker("api", 1, "busy"), worker("api", 2)),
        ready=200,
        oldest_age=40.0,
        binding="rate",
        rate_limit=10.0,
        kind_rate_limit={"render": 2.0},
        rate_held=True,
    )
    stats = {"api": PoolStats("api", ready=200, oldest_ready_age=40.0)}
    return api, view(row(snapshot(api)), stats=stats, pools=("api",))


@pytest.mark.parametrize("width", [80, 160])
def test_a_pool_held_by_rate_says_so_and_fits(width: int) -> None:
    _, v = rate_held_fleet()
    (summary,) = v.pools
    assert summary.rate_held and summary.binding == "rate"
    assert summary.rate_limit is None  # the test's config has no rate_limit key
    text = capture(v, width, height=24 if width == 80 else 48)
    assert all(len(line) <= width for line in text.splitlines()), text
    assert "held by rate" in text and "(rate)" in text
    if width == 80:
        assert len(text.splitlines()) <= 24


def test_held_by_rate_needs_a_backlog() -> None:
    api = pool("api", ready=0, rate_held=True, rate_limit=10.0)
    v = view(row(snapshot(api)), stats={"api": PoolStats("api", ready=0)}, pools=("api",))
    assert not v.pools[0].rate_held


def test_rate_limits_and_held_are_exported_and_in_the_schema() -> None:
    api, v = rate_held_fleet()
    samples = scrape(snapshot(api))
    limits = {s.labels["kind"]: s.value for s in samples["fleetd_pool_rate_limit"]}
    assert limits == {"": 10.0, "render": 2.0}
    assert [s.value for s in samples["fleetd_pool_rate_held"]] == [1.0]
    binding = {s.labels["constraint"]: s.value for s in samples["fleetd_pool_ceiling_binding"]}
    assert binding["rate"] == 1.0 and binding["max_workers"] == 0.0
    document = json.loads(json.dumps(v.to_dict()))
    jsonschema.validate(document, SCHEMA)
    assert document["pools"]["api"]["rate_held"] is True
    assert document["nodes"][0]["snapshot"]["pools"]["api"]["rate_limit"] == 10.0


@pytest.mark.parametrize(
    ("per_second", "shown"), [(1 / 3600, "1/h"), (10 / 60, "10/m"), (50.0, "50/s")]
)
def test_held_by_rate_names_the_limit_in_its_own_unit(per_second: float, shown: str) -> None:
    _, v = rate_held_fleet()
    v = replace(v, pools=(replace(v.pools[0], rate_limit=per_second),))
    text = capture(v, 80, 24)
    assert f"held by rate ({shown} fleet-wide)" in text, text


def test_the_jobs_table_shows_what_a_job_wrote_as_written() -> None:
    """``fleetd jobs`` and ``dlq list``: "[/bold]" in an error raised MarkupError (the listing
    ended in a traceback), an escape sequence in a tenant reached the terminal raw."""
    from supervisor.model import ErrorKind, Job, JobState
    from supervisor.observe.tables import jobs_table

    job = Job(
        id=5, kind="render", pool="bulk", state=JobState.DEAD, attempts=1, max_deliveries=3,
        payload={}, tenant="\x1b]0;pwned\x07", key=None, priority=0, enqueued_at=100.0,
        available_at=100.0, started_at=110.0, finished_at=120.0, result=None,
        last_error="bad [/bold] closing", error_kind=ErrorKind.PERMANENT, peak_rss=None,
        duration=None,
    )  # fmt: skip
    out = io.StringIO()
    jobs_table([job], Console(file=out, width=200, force_terminal=True))
    text = out.getvalue()
    assert "permanent: bad [/bold] closing" in text
    assert "\\x1b]0;pwned\\x07" in text and "\x1b]" not in text
