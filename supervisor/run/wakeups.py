"""``Wakeups``: enqueue wake-ups reaching the loop. They reach the link's store process
(LISTEN; SQLite's datagram socket), which runs an armed claim at once and names the pools it
was woken for (``on_wake_pools``); only without a store process does the loop bind SQLite's
socket itself (``Parts.loop_wakes``, the waker here). A woken pool claims early in the next
pass (``claim_woken``). Owned by the main thread.
"""

from __future__ import annotations

import logging

from supervisor.run.parts import Parts
from supervisor.store.wake import CONTROLS_WAKE

log = logging.getLogger("fleetd.supervisor")


class Wakeups:
    def __init__(self, parts: Parts) -> None:
        self.parts = parts
        self.next_waker_at = 0.0  # when to bind the waker again after it broke or failed
        self.woken_pools: set[str] = set()  # pools a wake-up named since the last pass

    def due_at(self) -> float | None:
        """When to try the waker again, while the loop binds it and has none."""
        p = self.parts
        return self.next_waker_at if p.waker is None and p.loop_wakes else None

    def reconnect(self, now: float) -> None:
        p = self.parts
        if p.waker is None and p.loop_wakes and now >= self.next_waker_at:
            self.connect(now)

    def connect(self, now: float) -> None:
        p = self.parts
        assert p.loop is not None
        try:
            p.waker = p.store.waker()
        except Exception as exc:
            log.warning("wake-up channel unavailable (%s); polling only", exc)
            p.waker, self.next_waker_at = None, now + 5.0
            return
        if p.waker is not None:
            p.loop.watch(p.waker.fileno(), self.on_wake)

    def on_wake(self) -> None:
        p = self.parts
        assert p.loop is not None
        self.on_wake_pools(p.waker.drain())
        if p.waker.broken:
            p.loop.unwatch(p.waker.fileno())
            p.waker.close()
            p.waker = None
            self.next_waker_at = p.clock.monotonic() + 1.0

    def on_wake_pools(self, pools: set[str]) -> None:
        p = self.parts
        if CONTROLS_WAKE in pools:
            p.controls.wake()
        for name in pools:
            if name in p.pools:
                p.dispatcher.wake(p.pools[name])
                self.woken_pools.add(name)

    def claim_woken(self, now: float) -> None:
        """Claim for the pools a wake-up named, early in the pass: once this pass's signals,
        frames and exits are read (so the claim is sized on them and a SIGTERM comes first),
        before the watchdog and the rest. Claimed from the wake-up's callback instead, a
        claim could go out sized before the same batch's JobDone frames were read."""
        woken, self.woken_pools = self.woken_pools, set()
        if self.parts.drain.active:
            return
        for name in woken:
            self.parts.dispatcher.claim(self.parts.pools[name], now)
