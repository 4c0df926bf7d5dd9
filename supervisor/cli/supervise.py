"""The commands that run a fleet or judge one: ``start`` (the supervisor, in the foreground),
``check`` (the config and each pool's plan; with ``--live``, the running fleet's health) and
``demo``."""

from __future__ import annotations

import json
import sys

import click

from supervisor.cli.options import config_option, config_option_for, friendly
from supervisor.cliclient import fleet_view, open_client


@click.command()
@config_option
@click.option("--node-id", help="This supervisor's name (default: host name and pid).")
@friendly
def start(config_path: str, node_id: str | None) -> None:
    """Run the supervisor in the foreground until SIGTERM or SIGINT (then drain)."""
    from supervisor.run.boot import run

    sys.exit(run(config_path, node_id=node_id))


@click.command()
@config_option_for("The demo fleet's config.", default="conf/demo.toml", show_default=True)
@click.option("--seconds", type=float, default=60.0, show_default=True, help="Longest run.")
@friendly
def demo(config_path: str, seconds: float) -> None:
    """Run the demo fleet on a mix of ordinary and hostile jobs, live, then drain it."""
    from supervisor.demo import run_demo

    sys.exit(run_demo(config_path, seconds))


@click.command()
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
