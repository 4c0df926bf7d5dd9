"""The ``fleetd`` command. The only module that prints or chooses exit codes.

Exit status: 0 success; 2 usage, config or input errors (one line on stderr saying what and
where; nothing written); 1 the database could not be reached mid-command.
"""

from __future__ import annotations

import contextlib
import functools
import json
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from supervisor.cliclient import check_pool_and_kind, fleet_view, open_client, wait_stopped
from supervisor.errors import FleetdError
from supervisor.model import ErrorKind, Job, JobFilter, JobState

F = TypeVar("F", bound=Callable[..., Any])


def _config_option(help: str, *, from_env: bool = True, **extra: Any) -> Callable[[F], F]:
    """``-c/--config``: the fleet.toml a command uses, by default also from FLEETD_CONFIG."""
    env = {"envvar": "FLEETD_CONFIG", "show_envvar": True} if from_env else {}
    return click.option(
        "-c", "--config", "config_path", type=click.Path(dir_okay=False), help=help, **env, **extra
    )


config_option = _config_option("fleet.toml to use.", required=True)


def _fail(message: str, code: int) -> None:
    click.echo(f"fleetd: error: {message}", err=True)
    sys.exit(code)


def friendly(func: F) -> F:
    """Turn fleetd's typed errors into one line on stderr and their exit status."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except FleetdError as exc:
            _fail(str(exc), exc.exit_code)

    return wrapper  # type: ignore[return-value]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="fleetd", prog_name="fleetd")
def main() -> None:
    """fleetd: a supervisor for hostile, CPU- and memory-heavy job pools on a durable queue."""


@main.command()
@config_option
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.option(
    "--live",
    is_flag=True,
    help="Instead: judge the running fleet's health from the node table (exit 1 if unhealthy).",
)
@friendly
def check(config_path: str, as_json: bool, live: bool) -> None:
    """Validate fleet.toml, import every handler, and print each pool's plan."""
    if live:
        _check_live(config_path, as_json)
        return
    from supervisor.check import plan_for, render_plan

    plan = plan_for(config_path)
    click.echo(json.dumps(plan, indent=2) if as_json else render_plan(plan))


def _check_live(config_path: str, as_json: bool) -> None:
    """The same verdict as /healthz, for every node sharing the database."""
    with open_client(config_path) as client:
        view = fleet_view(client)
    verdict = view.verdict
    if as_json:
        click.echo(json.dumps(verdict.to_dict(), indent=1))
    else:
        live = [n for n in view.nodes if n.live]
        click.echo(
            f"fleet {view.fleet}: {'healthy' if verdict.healthy else 'UNHEALTHY'} "
            f"({len(live)} live node(s), {len(view.nodes) - len(live)} gone or stopped)"
        )
        for p in verdict.problems:
            where = " ".join(x for x in (p.node, p.pool or "", p.worker or "") if x and x != "-")
            click.echo(f"  {p.reason}: {where + ': ' if where else ''}{p.detail}")
    sys.exit(0 if verdict.healthy else 1)


@main.command()
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


@main.command()
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
    _print_jobs(found, as_json)


def _print_jobs(found: list[Job], as_json: bool) -> None:
    if as_json:
        for job in found:
            click.echo(job.to_json())
        return
    from supervisor.observe.tables import jobs_table

    jobs_table(found)


@main.group()
@_config_option("fleet.toml to use; also accepted after the subcommand.")
@click.pass_context
def dlq(ctx: click.Context, config_path: str | None) -> None:
    """The dead-letter queue: list, requeue or purge dead jobs."""
    given = ctx.get_parameter_source("config_path") is ParameterSource.COMMANDLINE
    ctx.obj = (config_path, given)


# the contract writes ``fleetd dlq -c fleet.toml requeue 17``; the subcommands take -c too
# (not from the environment: the group reads FLEETD_CONFIG, and a -c given wins over it)
dlq_config_option = _config_option(
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
        _print_jobs(client.store.dlq_list(pool=pool, limit=limit), as_json)


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
    from supervisor.actions import dlq_lines

    where = _dlq_where(ids, everything, kind, tenant, error_kind, since)
    with open_client(_dlq_config(config_path), pool=pool) as client:
        done = client.store.dlq_requeue(list(ids) or None, pool=pool, where=where)
    _echo(dlq_lines("requeued", done, where))


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
    from supervisor.actions import dlq_lines

    where = _dlq_where(ids, everything, kind, tenant, error_kind, since)
    with open_client(_dlq_config(config_path), pool=pool) as client:
        purged = client.store.dlq_purge(list(ids) or None, pool=pool, where=where)
    _echo(dlq_lines("purged", purged, where))


def _echo(lines: list[str]) -> None:
    for line in lines:
        click.echo(line)


# ---- operator controls: cancel, pause, resume --------------------------------------------


@main.command()
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
            _echo(actions.cancel_preview(where, count, found))
            return
        out = client.store.cancel(list(ids) if ids else None, where=None if ids else where)
        _echo(actions.cancel_lines(out) if ids else actions.cancel_summary(where, out))
        if out.requested and not no_wait:
            _echo(wait_stopped(client, sorted(out.requested)))


@main.command()
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


@main.command()
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
    _echo(resume_lines(pool, kind, lifted, still))


@main.command()
@config_option
@click.option("--json", "as_json", is_flag=True, help="One JSON object a line.")
@friendly
def schedules(config_path: str, as_json: bool) -> None:
    """List each schedule: its last tick (job and state), next tick, last success, policies."""
    from supervisor.observe.fleetview import node_view, schedule_errors
    from supervisor.observe.schedview import summarize, with_errors

    with open_client(config_path) as client:
        read = client.store.schedule_states()
        found = summarize(client.config.schedule_specs(), read.states, read.now)
        nodes = [node_view(row) for row in client.store.list_nodes()]
    found = with_errors(found, schedule_errors(nodes))
    if as_json:
        for s in found:
            click.echo(json.dumps(s.to_dict()))
        return
    from supervisor.observe.tables import schedules_table

    schedules_table(found)


@main.command()
@config_option
@click.option("--node-id", help="This supervisor's name (default: host name and pid).")
@friendly
def start(config_path: str, node_id: str | None) -> None:
    """Run the supervisor in the foreground until SIGTERM or SIGINT (then drain)."""
    from supervisor.run.boot import run

    sys.exit(run(config_path, node_id=node_id))


@main.command()
@_config_option("The demo fleet's config.", default="conf/demo.toml", show_default=True)
@click.option("--seconds", type=float, default=60.0, show_default=True, help="Longest run.")
@friendly
def demo(config_path: str, seconds: float) -> None:
    """Run the demo fleet on a mix of ordinary and hostile jobs, live, then drain it."""
    from supervisor.demo import run_demo

    sys.exit(run_demo(config_path, seconds))


@main.command()
@config_option
@click.option("--once", is_flag=True, help="Print one frame and exit.")
@click.option("--json", "as_json", is_flag=True, help="Print one snapshot as JSON.")
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    default=1.0,
    show_default=True,
    help="Seconds between frames.",
)
@friendly
def status(config_path: str, once: bool, as_json: bool, interval: float) -> None:
    """The live view of every pool on every host sharing the database. On a terminal it
    takes keys: j/k or arrows select, p pauses or resumes a pool, c cancels a job, d opens a
    pool's dead letters (r requeue, x purge), / filters, ? lists the keys, q quits."""
    from rich.console import Console

    from supervisor.observe import status_view, terminal

    with open_client(config_path) as client:
        if as_json:
            click.echo(json.dumps(fleet_view(client).to_dict(), indent=1))
            return
        console = Console()
        if once:
            status_view.show_once(lambda: fleet_view(client), console)
            return
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C ends the view, not an error
            if terminal.interactive(console):
                from supervisor.livecontrols import LiveControls

                controls = LiveControls(client.store, lambda: fleet_view(client))
                terminal.run(controls, console, interval)
            else:
                status_view.watch(lambda: fleet_view(client), console, interval)
