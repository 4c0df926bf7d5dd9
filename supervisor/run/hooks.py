"""``Hooks``: the test seams of the supervisor, passed in (``Fleet``'s parts), never read from
the environment. Production runs with ``NO_HOOKS``, where each costs one comparison: the loop
fault once a pass, the kill's at a kill, the store's once when a store process opens it.

The tests start a supervisor with hooks through tests/support/hooked_start.py, a test-only entry
that calls ``boot.run`` with the hooks its arguments name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from supervisor.policy import KillKind

if TYPE_CHECKING:
    from supervisor.store import Store


@dataclass(frozen=True, slots=True)
class Hooks:
    # the loop raises in a pass once this node holds this many leases in workers (the error
    # policy's test: every worker stopped, every lease released, exit 70)
    loop_fault_at: int | None = None
    # kills of these kinds are booked but their SIGKILL is not sent: a kill that does not work
    # (a process in D state), so the worker's own alarm or the health check must catch it
    no_kill: frozenset[KillKind] = frozenset()
    # what the store processes run requests against, made of the store each opens (forked
    # with them): a verb made to fail, to show that a bug reaches the loop's guard and an
    # outage backs off (tests/integration/test_store_bugs.py)
    wrap_store: Callable[[Store], Store] | None = None

    def check_loop_fault(self, leases_in_workers: Iterable[object]) -> None:
        """Raise the injected loop fault once it is due (the loop asks only when it is set)."""
        if self.loop_fault_at is not None and sum(1 for _ in leases_in_workers) >= (
            self.loop_fault_at
        ):
            raise RuntimeError(f"injected loop fault (at {self.loop_fault_at} leases)")


NO_HOOKS = Hooks()
