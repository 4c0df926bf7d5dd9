"""Celery in ``python -m stress bench``: Redis broker and result backend, the prefork pool
(``celery -A stress.peers.celery_peer worker -c 2 -P prefork``), ``task_acks_late = True``
and ``worker_prefetch_multiplier = 1`` (the settings Celery's docs give for long and
unreliable tasks), ``task_time_limit`` at the bench's limit and
``worker_max_memory_per_child = 256 MiB``. Results are stored only for the fault jobs, so the
harness can read their fate; the throughput jobs ignore them, as fire-and-forget jobs do.

Every key of a namespace is under the kombu ``global_keyprefix`` ``<ns>:`` and its queue is
named after it, so runs never see each other's messages.
"""

from __future__ import annotations

import json
from typing import Any

import redis
from celery import Celery

from stress.peers import MEMORY_LIMIT_MIB, WORKERS, Fate, Peer, WorkerEnv, bin_path, tasks

RESULT_TASKS = ("bomb", "hang", "long", "crash")  # the fault jobs: the harness reads their fate


def make_app(ns: str, redis_url: str, time_limit: float) -> Celery:
    """The app for one namespace, with every body of ``tasks`` registered as ``bench.<name>``."""
    app = Celery("bench", broker=redis_url, backend=redis_url)
    prefix = {"global_keyprefix": f"{ns}:"}
    app.conf.update(
        task_default_queue=ns,
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        task_time_limit=time_limit,
        worker_max_memory_per_child=MEMORY_LIMIT_MIB * 1024,  # KiB
        task_ignore_result=True,
        broker_transport_options=prefix,
        result_backend_transport_options=prefix,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    for name in tasks.TASKS:
        app.task(name=f"bench.{name}", ignore_result=name not in RESULT_TASKS)(getattr(tasks, name))
    return app


_worker = WorkerEnv.read()
app = make_app(_worker.ns, _worker.redis_url, _worker.time_limit)  # what `celery -A` imports


class CeleryPeer(Peer):
    name = "celery"
    distributions = ("celery", "redis")
    memory_feature = f"worker_max_memory_per_child {MEMORY_LIMIT_MIB} MiB (checked after each task)"
    time_limit_feature = "task_time_limit (hard)"
    drain_feature = "warm shutdown: waits for running tasks"

    def setup(self) -> None:
        self.app = make_app(self.ns.name, self.ns.redis_url, self.time_limit)
        self.redis = redis.Redis.from_url(self.ns.redis_url)

    def enqueue(self, task: str, **kwargs: Any) -> str:
        return str(self.app.send_task(f"bench.{task}", kwargs=kwargs).id)

    def enqueue_many(self, task: str, kwargs: list[dict[str, Any]]) -> list[str]:
        with self.app.producer_or_acquire() as producer:
            return [
                str(self.app.send_task(f"bench.{task}", kwargs=kw, producer=producer).id)
                for kw in kwargs
            ]

    def commands(self) -> list[list[str]]:
        return [
            [
                bin_path("celery"),
                *f"-A {__name__} worker -c {WORKERS} -P prefork --loglevel WARNING".split(),
            ]
        ]

    def fate(self, job_id: str) -> Fate:
        result = self.app.AsyncResult(job_id)
        state = result.state
        if state == "FAILURE":
            return Fate(f"failed: {_short(result.result)}", True)
        if state == "SUCCESS":
            return Fate("succeeded", True)
        return Fate(self._where(job_id), False)

    def _where(self, job_id: str) -> str:
        """A message with no result yet: in the queue, delivered but unacked, or nowhere."""
        p = f"{self.ns.name}:"
        if any(job_id == _task_id(m) for m in self.redis.lrange(p + self.ns.name, 0, -1)):
            return "queued"
        if any(job_id == _task_id(m) for m in self.redis.hvals(p + "unacked")):
            return "unacked (back after visibility_timeout, 1 h)"
        return "no trace (not queued, no result)"

    def teardown(self) -> None:
        from stress.peers import drop_redis_keys

        self.app.close()
        self.redis.close()
        drop_redis_keys(self.ns.redis_url, f"{self.ns.name}:")


def _task_id(raw: bytes) -> str:
    """The task id inside a kombu message (queued: the message; unacked: [message, ...])."""
    try:
        data = json.loads(raw)
    except ValueError:
        return ""
    message = data[0] if isinstance(data, list) else data
    return str(message.get("headers", {}).get("id", ""))


def _short(exc: Any) -> str:
    from stress.peers import short_error

    text = f"{type(exc).__name__}: {exc}" if isinstance(exc, BaseException) else str(exc)
    return short_error(text)
