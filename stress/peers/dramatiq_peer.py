"""Dramatiq in ``python -m stress bench``: the Redis broker (its keys under the namespace),
``dramatiq stress.peers.dramatiq_peer:broker -p 2 -t 1`` (2 processes of one thread each),
its default middleware (Retries: 20 retries, backoff from 15 s; TimeLimit) with each actor's
``time_limit`` at the bench's limit. Dramatiq has no memory limit and no result backend by
default: a job's fate is read from the broker's own keys (queue, delay queue, dead letters).
"""

from __future__ import annotations

from typing import Any

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker

from stress.peers import WORKERS, Fate, Peer, WorkerEnv, bin_path, tasks

QUEUE = "bench"


def make_broker(ns: str, redis_url: str, time_limit: float) -> tuple[RedisBroker, dict[str, Any]]:
    """A broker for one namespace and the actors of ``tasks`` declared on it."""
    broker = RedisBroker(url=redis_url, namespace=ns)
    actors = {
        name: dramatiq.actor(
            getattr(tasks, name),
            actor_name=f"bench_{name}",
            queue_name=QUEUE,
            broker=broker,
            time_limit=int(time_limit * 1000),
        )
        for name in tasks.TASKS
    }
    return broker, actors


_worker = WorkerEnv.read()
broker, _actors = make_broker(_worker.ns, _worker.redis_url, _worker.time_limit)


class DramatiqPeer(Peer):
    name = "dramatiq"
    distributions = ("dramatiq", "redis")
    memory_feature = "none"
    time_limit_feature = "time_limit (raises in the job's thread)"
    drain_feature = "stops consuming, waits for running jobs (up to 10 min)"

    def setup(self) -> None:
        self.broker, self.actors = make_broker(self.ns.name, self.ns.redis_url, self.time_limit)
        self.redis = redis.Redis.from_url(self.ns.redis_url)

    def enqueue(self, task: str, **kwargs: Any) -> str:
        return str(self.actors[task].send_with_options(kwargs=kwargs).message_id)

    def commands(self) -> list[list[str]]:
        return [[bin_path("dramatiq"), *f"{__name__}:broker -p {WORKERS} -t 1 -Q {QUEUE}".split()]]

    def fate(self, job_id: str) -> Fate:
        p = f"{self.ns.name}:{QUEUE}"
        needle = job_id.encode()
        if any(needle in m for m in self.redis.hvals(f"{p}.XQ.msgs")):
            return Fate("dead-lettered", True)
        if any(needle in m for m in self.redis.hvals(f"{p}.DQ.msgs")):
            return Fate("retry scheduled (delay queue)", False)
        for redis_id, m in self.redis.hgetall(f"{p}.msgs").items():
            if needle in m:
                queued = redis_id in self.redis.lrange(p, 0, -1)
                return Fate("queued" if queued else "delivered, not acked", False)
        return Fate("acked (gone from the broker)", True)

    def teardown(self) -> None:
        from stress.peers import drop_redis_keys

        self.broker.close()
        self.redis.close()
        drop_redis_keys(self.ns.redis_url, f"{self.ns.name}:")
