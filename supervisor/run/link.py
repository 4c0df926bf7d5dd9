"""The loop's seam to its store processes: ``Link`` (what ``ProcessLink`` and ``InlineLink``
offer, supervisor/run/storelink.py), ``Reply``, and the one rule every reply is judged by.

    link.submit(request, on_reply) ──> the store process: ``execute(request)`` ──> Reply
         value ........................ what ``request.run(store)`` returned
         error: a StoreError .......... an outage (StoreUnavailable, or what the database
                                        raised): the caller backs off, as for any failure
         error: StoreBug .............. fleetd's own code failed in the store process
                                        (TypeError, AttributeError, ...): ``deliver``
                                        raises it into the loop's guard

The rule lives in ``deliver``, which every link calls to hand a reply over, so no caller can
judge a bug otherwise: a bug is never retried (a bug in a claim would otherwise back off and
retry forever). The reply still reaches its callback first, as a failed call, so the caller
puts back what it had in flight (a batch of results, a claim in flight) for the emergency
stop that follows (``Fleet.stop_after_error``: every lease released, exit 70).
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from supervisor.errors import StoreError
from supervisor.run.requests import Request

if TYPE_CHECKING:
    from supervisor.store import Store

log = logging.getLogger("fleetd.store")


class StoreBug(Exception):
    """An exception of fleetd's own code in a store call (not a StoreError): a bug. Its
    traceback is logged by the process that ran the call; this carries its line."""


@dataclass(frozen=True, slots=True)
class Reply:
    """What a call came back with. ``started`` is when the store process began it
    (monotonic, the same clock in every process of the host): a lease it took or extended
    runs out no earlier than ``started`` plus the lease."""

    value: Any
    error: StoreError | StoreBug | None
    started: float

    def __reduce__(self) -> tuple[Any, ...]:
        # pickled as a call with its fields: a slots dataclass's own way (its state set
        # field by field in Python) was ~10 µs of every reply, on each side of the socket
        return (Reply, (self.value, self.error, self.started))


OnReply = Callable[[Reply], None]


def execute(store: Store, request: Request[Any], monotonic: Callable[[], float]) -> Reply:
    """Run one request: a store error becomes the reply's error; anything else a StoreBug,
    its traceback logged here (the loop's end only gets its line)."""
    started = monotonic()
    try:
        return Reply(request.run(store), None, started)
    except StoreError as exc:
        return Reply(None, exc, started)
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
