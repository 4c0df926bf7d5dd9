"""``Publisher``: what leaves the fleet for those who watch it. Every second the node row
(``NodeHeartbeat``, with the snapshot as JSON) and a read of the queue's figures
(``Observer``); the metrics and health endpoint (``observe.server``, served by the loop, no
thread) answers from the last snapshot; the pinger's pings to idle workers. Owned by the main
thread.
"""

from __future__ import annotations

import logging

from supervisor.errors import FleetdError
from supervisor.observe.server import MetricsServer
from supervisor.run.link import Reply
from supervisor.run.parts import Parts
from supervisor.run.requests import NodeHeartbeat

log = logging.getLogger("fleetd.supervisor")

PUBLISH_EVERY = 1.0


class Publisher:
    def __init__(self, parts: Parts) -> None:
        self.parts = parts
        self.next_publish = 0.0
        self.heartbeat_in_flight = False

    def due_at(self) -> float:
        return self.next_publish

    def listen_metrics(self) -> None:
        """Bind ``fleet.metrics`` (served by the loop once it exists)."""
        p = self.parts
        address = p.config.metrics_address
        if address is None:
            return
        try:
            p.metrics = MetricsServer.bind(
                address,
                lambda: p.observer.current(p.clock.monotonic()),
                p.clock.monotonic,
            )
        except OSError as exc:
            raise FleetdError(f"metrics: cannot listen on {p.config.metrics}: {exc}") from exc
        log.info("metrics and health on http://%s/metrics and /healthz", p.config.metrics)

    def tick(self, now: float) -> None:
        p = self.parts
        p.pinger.tick(p.pools.values(), now)
        if p.metrics is not None:
            p.metrics.expire(now)
        if now < self.next_publish:
            return
        self.next_publish = now + PUBLISH_EVERY
        if now >= p.dispatcher.store_retry_at:  # not while backing off from a failure
            p.observer.request(p.chores, now)
        snapshot = self.snapshot_json()  # every tick: /healthz and /metrics serve it
        if self.heartbeat_in_flight:
            return  # the last one is not answered yet (a stalled store): the next will say it
        self.heartbeat_in_flight = True
        state = "draining" if p.drain.active else "running"
        p.chores.submit(NodeHeartbeat(p.node_id, state, snapshot), on_reply=self.heartbeat_written)

    def heartbeat_written(self, reply: Reply) -> None:
        self.heartbeat_in_flight = False
        if reply.error is not None:
            log.debug("node heartbeat failed: %s", reply.error)

    def snapshot_json(self) -> str:
        """This instant's FleetSnapshot as JSON (the node row; also kept for /metrics)."""
        p = self.parts
        return p.observer.build(
            p.clock.monotonic(),
            pools=p.pools,
            counters=p.counters,
            draining=p.drain.active,
            dispatcher=p.dispatcher,
            pinger=p.pinger,
            store_waiting_since=self.store_waiting_since(),
            scaling=p.scaler.scaling,
            schedules=p.scheduler.views(p.clock.monotonic()),
        ).to_json()

    def store_waiting_since(self) -> float | None:
        """When the oldest call still unanswered by a store process was sent."""
        p = self.parts
        times = [t for link in (p.link, p.chores) if (t := link.waiting_since()) is not None]
        return min(times, default=None)
