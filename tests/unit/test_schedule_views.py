"""What people see of schedules (pure): the statuses of ``fleetd schedules`` and ``fleetd
status``, the status frame's lines, the snapshot's JSON and the metrics."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import jsonschema
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from supervisor.model import JobState, ScheduleState, TickJob
from supervisor.observe import metrics, status_view
from supervisor.observe.fleetview import build_view
from supervisor.observe.schedview import summarize
from supervisor.observe.snapshot import FleetSnapshot, ScheduleView
from supervisor.schedules import ScheduleSpec, Timing

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "docs" / "status.schema.json").read_text())
T0 = 1_800_000_000.0


def spec(name: str) -> ScheduleSpec:
    return ScheduleSpec(name, Timing.of(None, 10), "echo", "bulk", 3)


def row(name: str, through: float, last: JobState | None = None, **kw: object) -> ScheduleState:
    recent = (
        () if last is None else (TickJob(through, 7, last, T0 - 3 if last == "done" else None),)
    )
    return ScheduleState(name, created_at=T0 - 100, through=through, recent=recent, **kw)  # type: ignore[arg-type]


def test_statuses() -> None:
    specs = [spec(n) for n in ("ok", "failed", "late", "waiting")]
    states = {
        "ok": row("ok", T0, JobState.DONE),
        "failed": row("failed", T0, JobState.DEAD),
        "late": row("late", T0 - 60, JobState.DONE),
        "gone": row("gone", T0 - 3600, missed=4),
    }
    found = {s.name: s for s in summarize(specs, states, T0 + 5, ahead=3)}
    assert {n: s.status for n, s in found.items()} == {
        "ok": "ok",
        "failed": "failed",
        "late": "late",
        "waiting": "waiting",
        "gone": "unconfigured",
    }
    assert found["ok"].next_ticks == (T0 + 10, T0 + 20, T0 + 30)
    assert found["late"].late_for == 40  # tick T0 - 50, grace 10 s, 15 s LATE_AFTER, now T0 + 5
    assert found["ok"].last_success_at == T0 - 3 and found["gone"].missed == 4
    assert [s.name for s in found.values() if s.problem] == ["failed", "late"]
    assert found["late"].detail().startswith("40s late: no pass decided its due tick")
    assert found["failed"].detail().startswith("its last job died")


def test_status_lists_schedules_that_failed_or_are_late() -> None:
    specs = [spec("nightly"), spec("fine")]
    states = {"nightly": row("nightly", T0, JobState.DEAD), "fine": row("fine", T0)}
    view = build_view(
        fleet="demo",
        database="sqlite:///x.db",
        configured={},
        stats={},
        rows=[],
        now=T0 + 5,
        schedules=summarize(specs, states, T0 + 5),
    )
    console = Console(record=True, width=80)
    console.print(status_view.render(view, 80, 24))
    text = console.export_text()
    assert "! schedule nightly: its last job died" in text
    assert "schedule fine" not in text
    jsonschema.validate(view.to_dict(), SCHEMA)
    assert view.to_dict()["schedules"][0]["last_state"] == "dead"


def test_snapshot_and_metrics() -> None:
    view = ScheduleView(
        name="nightly",
        kind="echo",
        last_success_at=T0 - 30,
        ticks={"on_time": 5, "late": 1, "missed": 2},
        late_for=0.0,
    )
    snap = FleetSnapshot("node-a", "host", 1, "demo", taken_at=T0, schedules={"nightly": view})
    again = FleetSnapshot.from_json(snap.to_json())
    assert again.schedules == {"nightly": view}
    text = metrics.render(metrics.make_registry(lambda: snap)).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[
        ("fleetd_schedule_last_success_timestamp_seconds", (("schedule", "nightly"),))
    ] == (T0 - 30)
    ticks = "fleetd_schedule_ticks_total"
    assert samples[(ticks, (("outcome", "missed"), ("schedule", "nightly")))] == 2
    assert samples[(ticks, (("outcome", "skipped"), ("schedule", "nightly")))] == 0
    assert samples[("fleetd_schedule_late_seconds", (("schedule", "nightly"),))] == 0


def test_a_schedule_a_running_supervisor_cannot_enqueue_is_an_error_in_status() -> None:
    """The node's snapshot carries why its passes do not enqueue a schedule (the database
    refused its write); ``fleetd status`` shows it, naming the node, above late or failed."""
    refused = "database refused the write: integer out of range"
    views = {"nightly": ScheduleView(name="nightly", error=refused), "fine": ScheduleView("fine")}
    snap = FleetSnapshot("node-a", "host", 1, "demo", taken_at=T0, schedules=views)
    node = {"node_id": "node-a", "hostname": "host", "pid": 1, "fleet": "demo", "age": 0.5}
    specs = [spec("nightly"), spec("fine")]
    states = {"nightly": row("nightly", T0 - 60, JobState.DEAD), "fine": row("fine", T0)}
    view = build_view(
        fleet="demo",
        database="sqlite:///x.db",
        configured={},
        stats={},
        rows=[{**node, "snapshot": snap.to_json()}],
        now=T0 + 5,
        schedules=summarize(specs, states, T0 + 5),
    )
    found = {s.name: s for s in view.schedules}
    assert found["nightly"].status == "error" and found["fine"].status == "ok"
    assert found["nightly"].error == f"{refused} (node node-a)"
    console = Console(record=True, width=200)
    console.print(status_view.render(view, 200, 24))
    assert f"! schedule nightly: not enqueued: {refused} (node node-a)" in console.export_text()
    jsonschema.validate(view.to_dict(), SCHEMA)
    assert FleetSnapshot.from_json(snap.to_json()).schedules == views


def test_a_last_job_still_queued_past_the_next_tick_is_stuck() -> None:
    """With overlap skip a queued last job holds every later tick back: flagged once the
    next tick is LATE_AFTER (15 s) past, with how long, in status and its JSON."""
    specs = [spec("nightly"), spec("busy")]

    def skipping(name: str, last: JobState) -> ScheduleState:
        # passes decided every tick to T0 + 30, skipping them: the job of tick T0 waits
        return replace(row(name, T0, last), through=T0 + 30)

    # still queued; running (overlap waits, nothing is stuck)
    states = {
        "nightly": skipping("nightly", JobState.QUEUED),
        "busy": skipping("busy", JobState.LEASED),
    }
    found = {s.name: s for s in summarize(specs, states, T0 + 10 + 15 + 7)}
    assert found["nightly"].status == "stuck" and found["nightly"].stuck_for == 7
    assert found["busy"].status == "ok"
    assert (
        found["nightly"]
        .detail()
        .startswith(
            "its last job is still queued 7s past the next tick: no later tick is enqueued until "
            "it runs (overlap skip)"
        )
    )
    assert summarize(specs, states, T0 + 10 + 15)[0].status == "ok"
    view = build_view(
        fleet="demo",
        database="sqlite:///x.db",
        configured={},
        stats={},
        rows=[],
        now=T0 + 32,
        schedules=summarize(specs, states, T0 + 32),
    )
    jsonschema.validate(view.to_dict(), SCHEMA)
    assert view.to_dict()["schedules"][0]["stuck_for"] == 7
