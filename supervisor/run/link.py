"""The loop's seam to its store processes: ``Link`` (what ``ProcessLink`` and ``InlineLink``
offer, supervisor/run/storelink.py), ``Reply``, and the one rule every reply is judged by.

    link.submit(request, on_reply) ──> the store process: ``execute(request)`` ──> Reply
         value ........................ what ``request.run(store)`` returned
         error: StoreUnavailable ...... an outage (the database unreachable, a connection
                                        lost, the store process gone): the caller backs off
         error: StoreBug .............. fleetd's own code failed in the store process
                                        (TypeError, AttributeError, ...), or the database
                                        refused its statement (bad SQL, a value it cannot
                                        hold): ``deliver`` raises it into the loop's guard

What the database refuses row by row is narrowed inside the request that writes the rows
(storecalls.write_results, schedulepass): only what no caller narrows comes back a bug.

The rule lives in ``deliver``, which every link calls to hand a reply over, so no caller can
judge a bug otherwise: a bug is never retried (a bug in a claim would otherwise back off and
retry forever). The reply still reaches its callback first, as a failed call, so the caller
puts back what it had in flight (a batch of results, a claim in flight) for the emergency
stop that follows (``stopping.stop_after_error``: every lease released, exit 70).
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from supervisor.errors import StoreError, StoreUnavailable
from supervisor.run.requests import Request

if TYPE_CHECKING:
    from supervisor.store import Store

log = logging.getLogger("fleetd.store")


class StoreBug(Exception):
    """A store call failed by fleetd's own doing: an exception of its code, or a statement
    the database refused (any StoreError but StoreUnavailable). Not retried: the loop's guard
    takes it. Its traceback is logged by the process that ran the call; this carries its line."""


@dataclass(frozen=True, slots=True)
class Reply:
    """What a call came back with. ``started`` is when the store process began it
    (monotonic, the same clock in every process of the host): a lease it took or extended
    runs out no earlier than ``started`` plus the lease."""

    value: Any
    error: StoreUnavailable | StoreBug | None
    started: float

    def __reduce__(self) -> tuple[Any, ...]:
        # pickled as a call with its fields: a slots dataclass's own way (its state set
        # field by field in Python) was ~10 µs of every reply, on each side of the socket
        return (Reply, (self.value, self.error, self.started))


OnReply = Callable[[Reply], None]


def execute(store: Store, request: Request[Any], monotonic: Callable[[], float]) -> Reply:
    """Run one request: an outage becomes the reply's error; anything else a StoreBug, its
    traceback logged here (the loop's end only gets its line)."""
    started = monotonic()
    try:
        return Reply(request.run(store), None, started)
    except StoreUnavailable as exc:
        return Reply(None, exc, started)
    except StoreError as exc:  # the database refused a statement of ours: not an outage
        what = type(request).__name__
        log.error("store call %s refused: %s", what, exc)
        return Reply(None, StoreBug(f"{what}: {exc}"), started)
    except Exception as exc:
        what = type(request).__name__
        log.error("store call %s failed:\n%s", what, traceback.format_exc())
        return Reply(None, StoreBug(f"{what}: {type(exc).__name__}: {exc}"), started)


def deliver(on_reply: OnReply, reply: Reply) -> None:
    """Hand ``reply`` to its callback; then, if it is a bug, raise it (the loop's guard)."""
    on_reply(reply)
    if isinstance(reply.error, StoreBug):
        raise reply.error


class Link(Protocol):
    """A way to the store for the loop (``ProcessLink``: a store process of its own;
    ``InlineLink``: the caller's thread, for tests). Owned by the main thread."""

    on_wake: Callable[[set[str]], None]  # pools a wake-up named (the store process's)

    @property
    def arms_claims(self) -> bool:
        """Whether a claim may wait in the store process for a wake-up (``ArmedClaim``)."""
        ...

    def submit(self, request: Request[Any], on_reply: OnReply) -> None:
        """Send ``request``; ``on_reply`` runs from the loop when it is answered (``deliver``:
        a StoreBug is raised after it)."""
        ...

    def pending(self) -> int: ...

    def waiting_since(self) -> float | None:
        """When the oldest unanswered call was due (monotonic), or None."""
        ...

    def attach(
        self, watch: Callable[[int, Callable[[], None]], None], unwatch: Callable[[int], None]
    ) -> None: ...

    def start(self, child_cleanup: Callable[[], None]) -> None: ...

    def tick(self, now: float, child_cleanup: Callable[[], None] | None = None) -> None: ...

    def wait_idle(self, timeout: float) -> bool:
        """Block until every call is answered or ``timeout`` passes."""
        ...

    def close(self, timeout: float) -> None: ...
