"""The job commands: ``enqueue`` (and, with ``--wait``, its result) and ``jobs`` (a listing)."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from supervisor.cli.options import config_option, friendly
from supervisor.cliclient import open_client
from supervisor.model import Job, JobState


@click.command()
@config_option
@click.argument("kind")
@click.argument("payload_json", required=False, default="{}")
@click.option("--tenant", help="Tenant the job belongs to (fleet-wide caps and fairness).")
@click.option("--key", help="Idempotency key: an existing key of this kind returns its job.")
@click.option("--priority", type=int, default=0, show_default=True, help="Higher runs first.")
@click.option("--delay", default="0", help='Run no earlier than this from now, e.g. "30s".')
@click.option(
    "--wait",
    "wait",
    is_flag=True,
    help="Then wait for the job to end and print its result (exit 1 if it ends dead or "
    "cancelled, or is still running after --timeout).",
)
@click.option(
    "--timeout", help='With --wait: give up waiting after this long, e.g. "5m" (default: never).'
)
@friendly
def enqueue(
    config_path: str,
    kind: str,
    payload_json: str,
    tenant: str | None,
    key: str | None,
    priority: int,
    delay: str,
    wait: bool,
    timeout: str | None,
) -> None:
    """Add a job of KIND with a JSON object PAYLOAD_JSON; print its id (with --wait, then
    its result)."""
    from supervisor.errors import PayloadError

    try:
        payload = json.loads(payload_json)
    except json.JSONDecodeError as exc:
        raise PayloadError(f"PAYLOAD_JSON is not JSON: {exc}") from None
    limit = _wait_limit(wait, timeout)
    with open_client(config_path, create=True) as client:
        job_id = client.enqueue(
            kind, payload, tenant=tenant, key=key, priority=priority, delay=delay
        )
        click.echo(job_id)
        if wait:
            _wait_and_print(client, job_id, limit)


def _wait_limit(wait: bool, timeout: str | None) -> float:
    """--timeout as seconds (checked before anything is written); no --timeout: no limit."""
    import math

    from supervisor.units import parse_duration

    if timeout is None:
        return math.inf
    if not wait:
        raise click.UsageError("--timeout goes with --wait")
    try:
        seconds = parse_duration(timeout)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--timeout'") from None
    if seconds <= 0:
        raise click.BadParameter(f"must be more than 0, not {timeout!r}", param_hint="'--timeout'")
    return seconds


def _wait_and_print(client: Any, job_id: int, limit: float) -> None:
    """Wait for the job (woken when it ends); its result on stdout, or why not on stderr."""
    from supervisor.actions import ended_line

    job = client.wait_all([job_id], limit, partial=True)[0]
    if job.state is JobState.DONE:
        click.echo(json.dumps(job.result))
        return
    click.echo(f"fleetd: {ended_line(job, limit)}", err=True)
    sys.exit(1)


_STATES = click.Choice([s.value for s in JobState])


@click.command()
@config_option
@click.option("--state", type=_STATES, help="Only jobs in this state.")
@click.option("--pool", help="Only jobs of this pool.")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object a line.")
@friendly
def jobs(config_path: str, state: str | None, pool: str | None, limit: int, as_json: bool) -> None:
    """List jobs by id."""
    with open_client(config_path, pool=pool) as client:
        found = client.store.list_jobs(
            state=JobState(state) if state else None, pool=pool, limit=limit
        )
    print_jobs(found, as_json)


def print_jobs(found: list[Job], as_json: bool) -> None:
    if as_json:
        for job in found:
            click.echo(job.to_json())
        return
    from supervisor.observe.tables import jobs_table

    jobs_table(found)
