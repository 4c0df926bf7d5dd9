"""``fleetd start`` with test seams (supervisor/run/hooks.py), for tests only: production code
reads no test switch, so a test that needs one starts its supervisor through this script.

    python tests/support/hooked_start.py [--loop-fault N] [--no-kill KIND[,KIND]]
        -c fleet.toml [--node-id ID]

``--loop-fault N``: the loop raises once this node holds N leases in workers (the error
policy). ``--no-kill timeout``: kills of that kind are booked but not sent (a kill that does
not work).
"""

from __future__ import annotations

import argparse
import sys

from supervisor.policy import KillKind
from supervisor.run.boot import run
from supervisor.run.hooks import Hooks


def hooks_of(args: argparse.Namespace) -> Hooks:
    kinds = frozenset(KillKind(k) for k in args.no_kill.split(",") if k) if args.no_kill else None
    return Hooks(loop_fault_at=args.loop_fault, no_kill=kinds or frozenset())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loop-fault", type=int, default=None)
    parser.add_argument("--no-kill", default="")
    parser.add_argument("-c", "--config", required=True)
    parser.add_argument("--node-id", default=None)
    args = parser.parse_args(argv)
    return run(args.config, node_id=args.node_id, hooks=hooks_of(args))


if __name__ == "__main__":
    sys.exit(main())
