"""RQ in ``python -m stress bench``: ``rq worker-pool -n 2`` on the namespace's queue, RQ's
default worker (a fresh work horse forked for every job), ``job_timeout`` at the bench's time
limit. RQ has no memory limit. Jobs name their function by import path
(``stress.peers.tasks.<name>``), so there is no app module to import.

Job ids start with the namespace, so its keys (``rq:job:<ns>-...``, ``rq:queue:<ns>``, the
registries) can be found and removed afterwards.
"""

from __future__ import annotations

import uuid
from typing import Any

import redis
from rq import Queue
from rq.job import Job

from stress.peers import WORKERS, Fate, Peer, bin_path, short_error


class RqPeer(Peer):
    name = "rq"
    distributions = ("rq",)
    memory_feature = "none"
    time_limit_feature = "job_timeout (the work horse is killed)"
    drain_feature = "warm shutdown: waits for the running job"

    def setup(self) -> None:
        self.redis = redis.Redis.from_url(self.ns.redis_url)
        self.queue = Queue(
            self.ns.name, connection=self.redis, default_timeout=int(self.time_limit)
        )

    def _id(self) -> str:
        return f"{self.ns.name}-{uuid.uuid4().hex}"

    def enqueue(self, task: str, **kwargs: Any) -> str:
        job = self.queue.enqueue(f"stress.peers.tasks.{task}", kwargs=kwargs, job_id=self._id())
        return str(job.id)

    def enqueue_many(self, task: str, kwargs: list[dict[str, Any]]) -> list[str]:
        data = [
            Queue.prepare_data(f"stress.peers.tasks.{task}", kwargs=kw, job_id=self._id())
            for kw in kwargs
        ]
        out: list[str] = []
        for i in range(0, len(data), 1000):
            out += [str(j.id) for j in self.queue.enqueue_many(data[i : i + 1000])]
        return out

    def commands(self) -> list[list[str]]:
        args = f"worker-pool -n {WORKERS} -u {self.ns.redis_url} --logging-level WARNING"
        return [[bin_path("rq"), *args.split(), self.ns.name]]

    def fate(self, job_id: str) -> Fate:
        try:
            job = Job.fetch(job_id, connection=self.redis)
        except Exception:  # rq.exceptions.NoSuchJobError, its name moved between versions
            return Fate("no trace (job gone)", True)
        status = str(job.get_status(refresh=True).value)
        if status == "failed":
            return Fate(f"failed: {_last_line(job)}", True)
        return Fate(status, status in ("finished", "stopped", "canceled"))

    def teardown(self) -> None:
        from stress.peers import drop_redis_keys

        self.redis.srem("rq:queues", f"rq:queue:{self.ns.name}")
        self.redis.close()
        drop_redis_keys(self.ns.redis_url, f"rq:*{self.ns.name}")


def _last_line(job: Job) -> str:
    """The last line of the job's recorded error: what RQ says happened."""
    text = ""
    try:
        result = job.latest_result()
        text = (result.exc_string or "") if result else ""
    except Exception:
        text = ""
    text = text or (job.exc_info or "")
    lines = [line for line in str(text).strip().splitlines() if line.strip()]
    return short_error(lines[-1]) if lines else "no error recorded"
