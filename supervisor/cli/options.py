"""What every command shares: ``-c/--config``, and fleetd's typed errors turned into one line
on stderr and their exit status (``friendly``)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from supervisor.errors import FleetdError

F = TypeVar("F", bound=Callable[..., Any])


def config_option_for(help: str, *, from_env: bool = True, **extra: Any) -> Callable[[F], F]:
    """``-c/--config``: the fleet.toml a command uses, by default also from FLEETD_CONFIG."""
    env = {"envvar": "FLEETD_CONFIG", "show_envvar": True} if from_env else {}
    return click.option(
        "-c", "--config", "config_path", type=click.Path(dir_okay=False), help=help, **env, **extra
    )


config_option = config_option_for("fleet.toml to use.", required=True)


def fail(message: str, code: int) -> None:
    click.echo(f"fleetd: error: {message}", err=True)
    sys.exit(code)


def friendly(func: F) -> F:
    """Turn fleetd's typed errors into one line on stderr and their exit status."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except FleetdError as exc:
            fail(str(exc), exc.exit_code)

    return wrapper  # type: ignore[return-value]


def echo_lines(lines: list[str]) -> None:
    for line in lines:
        click.echo(line)
