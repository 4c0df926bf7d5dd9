"""The operator controls: ``cancel`` (by id, or by filter with ``--yes``), ``pause`` and
``resume`` (a pool, or one kind of it, on every host)."""

from __future__ import annotations

import click

from supervisor.cli.options import config_option, echo_lines, friendly
from supervisor.cliclient import check_pool_and_kind, open_client, wait_stopped
from supervisor.model import JobFilter, JobState


@click.command()
@config_option
@click.argument("ids", nargs=-1, type=int)
@click.option("--kind", help="Cancel the jobs of this kind (with --yes).")
@click.option("--tenant", help="Cancel the jobs of this tenant (with --yes).")
@click.option("--pool", help="Cancel the jobs of this pool (with --yes).")
@click.option(
    "--state",
    type=click.Choice(["queued", "leased"]),
    help="Only queued (waiting) or only leased (running) jobs; default both.",
)
@click.option("--yes", is_flag=True, help="Do cancel what a filter matches (else: dry run).")
@click.option("--no-wait", is_flag=True, help="Do not wait to see running jobs stopped.")
@friendly
def cancel(
    config_path: str,
    ids: tuple[int, ...],
    kind: str | None,
    tenant: str | None,
    pool: str | None,
    state: str | None,
    yes: bool,
    no_wait: bool,
) -> None:
    """Cancel jobs: IDS, or those a filter matches. Queued jobs are cancelled at once;
    running ones are stopped within a second by the supervisor running them (any host)."""
    from supervisor import actions

    where = JobFilter(
        kind=kind, tenant=tenant, pool=pool, states=(JobState(state),) if state else None
    )
    if ids and where != JobFilter():
        raise click.UsageError("give job IDS or a filter (--kind, --tenant, --pool), not both")
    if not ids and where.empty:
        raise click.UsageError("give job IDS or a filter (--kind, --tenant, --pool)")
    with open_client(config_path, pool=pool) as client:
        if not ids and not yes:
            count, found = client.store.find_cancellable(where, limit=actions.SHOWN)
            echo_lines(actions.cancel_preview(where, count, found))
            return
        out = client.store.cancel(list(ids) if ids else None, where=None if ids else where)
        echo_lines(actions.cancel_lines(out) if ids else actions.cancel_summary(where, out))
        if out.requested and not no_wait:
            echo_lines(wait_stopped(client, sorted(out.requested)))


@click.command()
@config_option
@click.argument("pool")
@click.option("--kind", help="Pause only this kind of the pool.")
@friendly
def pause(config_path: str, pool: str, kind: str | None) -> None:
    """Pause POOL (or one --kind of it) on every host: no new job of it starts, running
    jobs finish, the backlog waits. Undo with fleetd resume."""
    from supervisor.actions import pause_line

    with open_client(config_path) as client:
        check_pool_and_kind(client, pool, kind)
        took = client.store.pause(pool, kind)
    click.echo(pause_line(pool, kind, took, config_path))


@click.command()
@config_option
@click.argument("pool")
@click.option("--kind", help="Resume only this kind (else every pause of the pool).")
@friendly
def resume(config_path: str, pool: str, kind: str | None) -> None:
    """Resume POOL (every pause of it, or one --kind) on every host."""
    from supervisor.actions import resume_lines

    with open_client(config_path) as client:
        check_pool_and_kind(client, pool, kind)
        lifted = client.store.resume(pool, kind)
        still = [p for p in client.store.pauses() if p.pool == pool]
    echo_lines(resume_lines(pool, kind, lifted, still))
