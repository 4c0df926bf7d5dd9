"""The ``fleetd`` command: the click group, and its commands by group, a module each. The
only package that prints or chooses exit codes.

Exit status: 0 success; 2 usage, config or input errors (one line on stderr saying what and
where; nothing written); 1 the database could not be reached mid-command.

- options.py: ``-c/--config``, and fleetd's typed errors as one line and an exit status;
- supervise.py: ``start``, ``check`` (and ``check --live``), ``demo``;
- jobs.py: ``enqueue`` (and ``--wait``), ``jobs``;
- dlq.py: ``dlq list``, ``dlq requeue``, ``dlq purge``;
- controls.py: ``cancel``, ``pause``, ``resume``;
- views.py: ``status``, ``schedules``.
"""

from __future__ import annotations

import click

from supervisor.cli import controls, dlq, jobs, supervise, views


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="fleetd", prog_name="fleetd")
def main() -> None:
    """fleetd: a supervisor for hostile, CPU- and memory-heavy job pools on a durable queue."""


for command in (
    supervise.start,
    supervise.check,
    supervise.demo,
    jobs.enqueue,
    jobs.jobs,
    dlq.dlq,
    controls.cancel,
    controls.pause,
    controls.resume,
    views.status,
    views.schedules,
):
    main.add_command(command)
