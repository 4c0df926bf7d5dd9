"""Argument types shared by the stress commands: bad values are refused by argparse with a
one-line error (exit 2) instead of failing deep inside a run."""

from __future__ import annotations

import argparse
import os

ENGINES = ("sqlite", "postgres")
DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1/test"


def positive_int(text: str) -> int:
    """A whole number of at least 1 (jobs, workers, samples)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def engine_arguments(parser: argparse.ArgumentParser) -> None:
    """``--engine sqlite|postgres|both`` (default both) and ``--postgres-url`` (default
    ``$FLEETD_TEST_POSTGRES_URL``, else the local server's ``test`` database)."""
    parser.add_argument("--engine", choices=(*ENGINES, "both"), default="both")
    parser.add_argument(
        "--postgres-url", default=os.environ.get("FLEETD_TEST_POSTGRES_URL", DEFAULT_POSTGRES)
    )


def engines(args: argparse.Namespace) -> tuple[str, ...]:
    """The engines ``--engine`` names, in order."""
    return ENGINES if args.engine == "both" else (args.engine,)


def host_port(text: str) -> tuple[str, int]:
    """``host:port`` (``:6379`` means 127.0.0.1)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"not host:port: {text!r}")
    return host or "127.0.0.1", int(port)
