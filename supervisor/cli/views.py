"""The views: ``status`` (live, or one frame, or JSON; interactive on a terminal) and
``schedules`` (each schedule's last and next tick)."""

from __future__ import annotations

import contextlib
import json

import click

from supervisor.cli.options import config_option, friendly
from supervisor.cliclient import fleet_view, open_client


@click.command()
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


@click.command()
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
