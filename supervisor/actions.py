"""Pure: what the operator commands say (``fleetd cancel``, ``pause``, ``resume``, the bulk
``dlq`` actions), and the same words in one status line for the keys of the live view
(``fleetd status``: ``*_key_line``). Values in, lines out; the CLI prints them. Every action
says what it did, names what it left alone and why, and how to undo it where that makes sense.
"""

from __future__ import annotations

from collections.abc import Sequence

from supervisor.model import CancelOutcome, Job, JobFilter, JobState, Pause, iso

SHOWN = 20  # ids listed in a line before "and N more"


def id_list(ids: Sequence[int]) -> str:
    """``3, 4, 9`` or ``3, 4, ... and 120 more``.

    >>> id_list([1, 2, 3])
    '1, 2, 3'
    >>> id_list(list(range(1, 25)))
    '1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20 and 4 more'
    """
    shown = ", ".join(map(str, ids[:SHOWN]))
    return shown + (f" and {len(ids) - SHOWN} more" if len(ids) > SHOWN else "")


def describe_filter(where: JobFilter) -> str:
    """The filter as the operator typed it.

    >>> describe_filter(JobFilter(kind="render", tenant="acme", since=3600.0))
    'kind=render tenant=acme since=3600s'
    """
    parts = [
        f"{name}={value}"
        for name, value in (
            ("kind", where.kind),
            ("tenant", where.tenant),
            ("pool", where.pool),
            ("error-kind", where.error_kind),
        )
        if value is not None
    ]
    if where.states:
        parts.append("state=" + ",".join(str(s) for s in where.states))
    if where.since is not None:
        parts.append(f"since={where.since:g}s")
    return " ".join(parts) or "(every job)"


def cancel_lines(out: CancelOutcome) -> list[str]:
    """One line per job: cancelled, asked to stop (and where), or left alone (and why)."""
    lines = [f"job {i}: cancelled (it was queued; it will not run)" for i in out.cancelled]
    for job_id, node in sorted(out.requested.items()):
        lines.append(
            f"job {job_id}: cancel requested: it is running on {node or 'a supervisor'}, "
            "which stops it within a second"
        )
    for job_id, state in sorted(out.unchanged.items()):
        lines.append(f"job {job_id}: {state} already; nothing changed")
    return lines


def stopped_lines(jobs: Sequence[Job], waited: float) -> list[str]:
    """What became of jobs whose cancel was requested, after waiting ``waited`` seconds."""
    lines = []
    for job in jobs:
        if job.state is JobState.CANCELLED:
            lines.append(f"job {job.id}: stopped, now cancelled")
        elif job.state is JobState.LEASED:
            lines.append(
                f"job {job.id}: still stopping after {waited:g}s (held by {job.owner}; if "
                "that supervisor is gone the job ends cancelled when its lease expires)"
            )
        else:
            lines.append(f"job {job.id}: ended {job.state} before the cancel took effect")
    return lines


def ended_line(job: Job, waited: float) -> str:
    """Why ``fleetd enqueue --wait`` prints no result: the job ended dead or cancelled, or
    was not final after ``waited`` seconds."""
    if job.state is JobState.DEAD:
        return f"job {job.id} ended dead ({job.error_kind}): {job.last_error}"
    if job.state is JobState.CANCELLED:
        return f"job {job.id} was cancelled"
    return f"job {job.id} is still {job.state} after {waited:g}s (it goes on; fleetd jobs shows it)"


def cancel_preview(where: JobFilter, count: int, found: Sequence[Job]) -> list[str]:
    """A cancel by filter without --yes: what it would touch, and how to do it."""
    if not count:
        return [f"no queued or running job matches {describe_filter(where)}; nothing to cancel"]
    running = sum(1 for j in found if j.state is JobState.LEASED)
    lines = [
        f"would cancel {count} job(s) matching {describe_filter(where)}: "
        f"{id_list([j.id for j in found])}"
    ]
    if running:
        lines.append(f"{running} of those listed are running and would be stopped")
    lines.append("nothing changed: run again with --yes to cancel them")
    return lines


def cancel_summary(where: JobFilter, out: CancelOutcome) -> list[str]:
    """A cancel by filter with --yes: what it did."""
    if not out.took:
        return [f"no queued or running job matches {describe_filter(where)}; nothing changed"]
    lines = []
    if out.cancelled:
        lines.append(f"cancelled {len(out.cancelled)} queued job(s): {id_list(out.cancelled)}")
    if out.requested:
        ids = sorted(out.requested)
        lines.append(f"asked {len(ids)} running job(s) to stop (within a second): {id_list(ids)}")
    return lines


def what(pool: str, kind: str | None) -> str:
    return f"kind {kind} of pool {pool}" if kind else f"pool {pool}"


def _paused(pool: str, kind: str | None, took: bool) -> str:
    if not took:
        return f"{what(pool, kind)} was paused already; nothing changed"
    return f"paused {what(pool, kind)} fleet-wide"


def pause_line(pool: str, kind: str | None, took: bool, config_path: str) -> str:
    undo = f"fleetd resume -c {config_path} {pool}" + (f" --kind {kind}" if kind else "")
    if not took:
        return f"{_paused(pool, kind, took)} (undo: {undo})"
    return (
        f"{_paused(pool, kind, took)}: no new job of it starts; running jobs finish (undo: {undo})"
    )


def pause_key_line(pool: str, took: bool, kinds_kept: Sequence[str] = ()) -> str:
    """The live view's ``p`` on a pool that was not paused. ``kinds_kept``: kinds of it
    paused one by one, which the next ``p`` leaves paused (it lifts only its own pause).

    >>> pause_key_line("bulk", True)
    'paused pool bulk fleet-wide (running jobs finish) — p again to resume'
    >>> pause_key_line("bulk", True, ["render"])
    'paused pool bulk fleet-wide (running jobs finish) — p again to resume all but kind render'
    """
    but = f" all but {_kinds(kinds_kept)}" if kinds_kept else ""
    if not took:
        return f"{_paused(pool, None, took)} — p again to resume{but}"
    return f"{_paused(pool, None, took)} (running jobs finish) — p again to resume{but}"


def _kinds(kinds: Sequence[str]) -> str:
    return f"kind{'s' if len(kinds) > 1 else ''} {', '.join(kinds)}"


def resume_lines(
    pool: str, kind: str | None, lifted: Sequence[Pause], still: Sequence[Pause] = ()
) -> list[str]:
    """What ``fleetd resume`` did; ``still`` is every pause of ``pool`` left in force after it,
    so a kind resumed (or never paused) under a pause of the whole pool is not called running.
    """
    whole = next((p for p in still if p.pool == pool and p.kind is None), None)
    if not lifted:
        if kind is not None and whole is not None:
            return [
                f"{what(pool, kind)} has no pause of its own; pool {pool} is paused as a "
                "whole, so it still does not start (fleetd resume POOL lifts that)"
            ]
        return [f"{what(pool, kind)} was not paused; nothing changed"]
    lines = [
        f"resumed {what(p.pool, p.kind)} (paused since {iso(p.since)}): its jobs start again"
        for p in lifted
    ]
    if whole is not None and kind is not None:
        lines = [
            f"resumed {what(p.pool, p.kind)} (paused since {iso(p.since)}), but pool {pool} "
            "is still paused as a whole: its jobs start once the pool is resumed"
            for p in lifted
        ]
    return lines


def resume_key_line(pool: str, lifted: Sequence[Pause], kinds_kept: Sequence[str] = ()) -> str:
    """The live view's ``p`` on a paused pool: the pool-wide pause lifted. ``kinds_kept``:
    kinds of it paused one by one (``fleetd pause --kind``), left paused and named.

    >>> resume_key_line("bulk", [Pause("bulk", None, 0.0)])
    'resumed pool bulk (paused since 00:00:00Z): its jobs start again — p pauses it again'
    >>> resume_key_line("bulk", [Pause("bulk", None, 0.0)], ["render"])[:71]
    'resumed pool bulk (paused since 00:00:00Z) but kind render stays paused'
    """
    if not lifted and kinds_kept:
        return (
            f"pool {pool} has no pool-wide pause to lift: {_kinds(kinds_kept)} are paused one "
            f"by one and stay so (fleetd resume {pool} lifts them)"
        )
    if not lifted:
        return resume_lines(pool, None, lifted)[0]
    if kinds_kept:
        since = (iso(min(p.since for p in lifted)) or "")[11:19]
        verb = "stay" if len(kinds_kept) > 1 else "stays"
        return (
            f"resumed pool {pool} (paused since {since}Z) but {_kinds(kinds_kept)} {verb} paused "
            f"(fleetd resume {pool} --kind {kinds_kept[0] if len(kinds_kept) == 1 else 'K'}) "
            "— p pauses it again"
        )
    since = (iso(min(p.since for p in lifted)) or "")[11:19]
    kinds = sorted(p.kind for p in lifted if p.kind is not None)
    if any(p.kind is None for p in lifted):
        lifted_what = what(pool, None) + (f" (and kinds {', '.join(kinds)})" if kinds else "")
    else:
        lifted_what = f"kind{'s' if len(kinds) > 1 else ''} {', '.join(kinds)} of pool {pool}"
    return (
        f"resumed {lifted_what} (paused since {since}Z): its jobs start again — p pauses it again"
    )


def cancel_key_line(job_id: int, out: CancelOutcome) -> str:
    """The live view's ``c`` then ``y`` on one job.

    >>> cancel_key_line(812, CancelOutcome(requested={812: "host-a"}))
    'job 812: cancel requested: host-a stops it within a second; it ends cancelled'
    """
    if job_id in out.requested:
        node = out.requested[job_id] or "its supervisor"
        return f"job {job_id}: cancel requested: {node} stops it within a second; it ends cancelled"
    return cancel_lines(out)[0]


def dlq_lines(verb: str, ids: Sequence[int], where: JobFilter | None) -> list[str]:
    """``requeued 3 job(s): 4, 5, 9`` (with the filter, when one chose them)."""
    chosen = f" matching {describe_filter(where)}" if where is not None else ""
    if not ids:
        return [f"no dead job{chosen}; nothing {verb}"]
    return [f"{verb} {len(ids)} job(s){chosen}: {id_list(ids)}"]
