"""``fleetd dlq``: list, requeue and purge dead jobs, by id, by filter or all of them."""

from __future__ import annotations

import click
from click.core import ParameterSource

from supervisor.cli.jobs import print_jobs
from supervisor.cli.options import F, config_option_for, echo_lines, friendly
from supervisor.cliclient import open_client
from supervisor.model import ErrorKind, JobFilter


@click.group()
@config_option_for("fleet.toml to use; also accepted after the subcommand.")
@click.pass_context
def dlq(ctx: click.Context, config_path: str | None) -> None:
    """The dead-letter queue: list, requeue or purge dead jobs."""
    given = ctx.get_parameter_source("config_path") is ParameterSource.COMMANDLINE
    ctx.obj = (config_path, given)


# the contract writes ``fleetd dlq -c fleet.toml requeue 17``; the subcommands take -c too
# (not from the environment: the group reads FLEETD_CONFIG, and a -c given wins over it)
dlq_config_option = config_option_for(
    "fleet.toml to use (or give it before the subcommand, or set FLEETD_CONFIG).", from_env=False
)


def _dlq_config(config_path: str | None) -> str:
    """The subcommand's -c, else the group's (given or from FLEETD_CONFIG); two different
    ones on the command line are a usage error, not a silent choice."""
    group_path, given = click.get_current_context().obj
    if config_path and given and config_path != group_path:
        raise click.UsageError(f"-c given twice ({group_path}, {config_path}): give it once")
    chosen = config_path or group_path
    if not chosen:
        raise click.UsageError("Missing option '-c' / '--config' (or set FLEETD_CONFIG).")
    return str(chosen)


@dlq.command("list")
@dlq_config_option
@click.option("--pool", help="Only dead jobs of this pool.")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object a line.")
@friendly
def dlq_list(config_path: str | None, pool: str | None, limit: int, as_json: bool) -> None:
    """List dead jobs with their last error."""
    with open_client(_dlq_config(config_path), pool=pool) as client:
        print_jobs(client.store.dlq_list(pool=pool, limit=limit), as_json)


def _dlq_filter_options(func: F) -> F:
    """--kind, --tenant, --error-kind, --since: which dead jobs a bulk action touches."""
    for option in reversed(
        [
            click.option("--kind", help="Only dead jobs of this kind."),
            click.option("--tenant", help="Only dead jobs of this tenant."),
            click.option(
                "--error-kind",
                type=click.Choice([k.value for k in ErrorKind]),
                help="Only dead jobs that died of this.",
            ),
            click.option("--since", help='Only jobs that died within this long, e.g. "1h".'),
        ]
    ):
        func = option(func)
    return func


def _dlq_where(
    ids: tuple[int, ...],
    everything: bool,
    kind: str | None,
    tenant: str | None,
    error_kind: str | None,
    since: str | None,
) -> JobFilter | None:
    """The filter of a bulk dead-letter action; exactly one of IDS, a filter or --all."""
    from supervisor.units import parse_duration

    try:
        seconds = None if since is None else parse_duration(since)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from None
    where = JobFilter(
        kind=kind,
        tenant=tenant,
        error_kind=ErrorKind(error_kind) if error_kind else None,
        since=seconds,
    )
    given = where != JobFilter()
    if sum((bool(ids), given, everything)) != 1:
        raise click.UsageError(
            "give job IDS, a filter (--kind, --tenant, --error-kind, --since) or --all"
        )
    return where if given else None


@dlq.command("requeue")
@dlq_config_option
@click.argument("ids", nargs=-1, type=int)
@click.option("--all", "everything", is_flag=True, help="Every dead job (of --pool).")
@click.option("--pool", help="Only this pool's dead jobs.")
@_dlq_filter_options
@friendly
def dlq_requeue(
    config_path: str | None,
    ids: tuple[int, ...],
    everything: bool,
    pool: str | None,
    kind: str | None,
    tenant: str | None,
    error_kind: str | None,
    since: str | None,
) -> None:
    """Give dead jobs a fresh delivery budget: IDS, those a filter matches, or --all."""
    _bulk("requeued", config_path, ids, everything, pool, (kind, tenant, error_kind, since))


@dlq.command("purge")
@dlq_config_option
@click.argument("ids", nargs=-1, type=int)
@click.option("--all", "everything", is_flag=True, help="Every dead job (of --pool).")
@click.option("--pool", help="Only this pool's dead jobs.")
@_dlq_filter_options
@friendly
def dlq_purge(
    config_path: str | None,
    ids: tuple[int, ...],
    everything: bool,
    pool: str | None,
    kind: str | None,
    tenant: str | None,
    error_kind: str | None,
    since: str | None,
) -> None:
    """Delete dead jobs: IDS, those a filter matches, or --all (of --pool)."""
    _bulk("purged", config_path, ids, everything, pool, (kind, tenant, error_kind, since))


def _bulk(
    done: str,
    config_path: str | None,
    ids: tuple[int, ...],
    everything: bool,
    pool: str | None,
    filters: tuple[str | None, str | None, str | None, str | None],
) -> None:
    """Requeue or purge (``done``: "requeued", "purged") what IDS or the filters name."""
    from supervisor.actions import dlq_lines

    where = _dlq_where(ids, everything, *filters)
    with open_client(_dlq_config(config_path), pool=pool) as client:
        verb = client.store.dlq_requeue if done == "requeued" else client.store.dlq_purge
        changed = verb(list(ids) or None, pool=pool, where=where)
    echo_lines(dlq_lines(done, changed, where))
