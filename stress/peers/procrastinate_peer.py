"""procrastinate in ``python -m stress bench``: PostgreSQL (a fresh schema per namespace, its
own ``procrastinate schema`` applied), two ``procrastinate --app stress.peers.procrastinate_peer.app
worker --concurrency 1`` processes (procrastinate's worker is one asyncio process; a sync job
runs in a thread, so two processes are what uses two cores). Defaults otherwise: no retry, no
time limit, no memory limit; a job's fate is its row's ``status``.
"""

from __future__ import annotations

from typing import Any

import procrastinate

from stress.peers import WORKERS, Fate, Peer, WorkerEnv, bin_path, schema_url, tasks


def make_app(ns: str, postgres_url: str) -> procrastinate.App:
    """The app for one namespace: its schema, its queue, the bodies of ``tasks`` on it."""
    connector = procrastinate.PsycopgConnector(conninfo=schema_url(postgres_url, ns))
    app = procrastinate.App(connector=connector)
    for name in tasks.TASKS:
        app.task(name=f"bench_{name}", queue=ns)(getattr(tasks, name))
    return app


_worker = WorkerEnv.read()
app = make_app(_worker.ns, _worker.postgres_url)  # what `procrastinate --app` imports


class ProcrastinatePeer(Peer):
    name = "procrastinate"
    distributions = ("procrastinate", "psycopg")
    memory_feature = "none"
    time_limit_feature = "none"
    drain_feature = "graceful: waits for running jobs (no timeout by default)"

    def setup(self) -> None:
        import psycopg

        from stress.peers import recreate_schema

        recreate_schema(self.ns.postgres_url, self.ns.name)
        self.app = make_app(self.ns.name, self.ns.postgres_url)
        self.app.open()
        self.app.schema_manager.apply_schema()
        self.db = psycopg.connect(schema_url(self.ns.postgres_url, self.ns.name), autocommit=True)

    def enqueue(self, task: str, **kwargs: Any) -> str:
        return str(self.app.tasks[f"bench_{task}"].defer(**kwargs))

    def enqueue_many(self, task: str, kwargs: list[dict[str, Any]]) -> list[str]:
        deferrer = self.app.tasks[f"bench_{task}"]
        out: list[str] = []
        for i in range(0, len(kwargs), 1000):
            out += [str(j) for j in deferrer.batch_defer(*kwargs[i : i + 1000])]
        return out

    def commands(self) -> list[list[str]]:
        args = f"--app {__name__}.app --log-level warning worker --queues {self.ns.name}"
        return [
            [bin_path("procrastinate"), *args.split(), "--concurrency", "1", "--name", f"w{n}"]
            for n in range(WORKERS)
        ]

    def fate(self, job_id: str) -> Fate:
        row = self.db.execute(
            "SELECT status, attempts FROM procrastinate_jobs WHERE id = %s", (int(job_id),)
        ).fetchone()
        if row is None:
            return Fate("no trace (row gone)", True)
        status, attempts = row
        final = status in ("succeeded", "failed", "cancelled", "aborted")
        return Fate(f"{status}, {attempts} attempt{'s' if attempts != 1 else ''}", final)

    def teardown(self) -> None:
        from stress.peers import recreate_schema

        self.app.close()
        self.db.close()
        recreate_schema(self.ns.postgres_url, self.ns.name, drop_only=True)
