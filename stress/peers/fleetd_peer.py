"""fleetd in ``python -m stress bench``: ``fleetd start -c fleet.toml`` with one pool of
``WORKERS`` workers, ``memory_limit = "256MiB"`` and ``timeout`` at the bench's time limit;
everything else at its default, except the 5 s ``grace_period`` that the benches'
``write_fleet`` sets (the default is 30 s). SQLite (fleetd's default) or PostgreSQL.

The handlers below are what the pool runs: each passes its JSON payload to the body in
``stress.peers.tasks`` as keyword arguments.
"""

from __future__ import annotations

from typing import Any, ClassVar

from stress.peers import MEMORY_LIMIT_MIB, WORKERS, Fate, Peer, bin_path, tasks

Payload = dict[str, Any]


def noop(payload: Payload) -> None:
    tasks.noop(**payload)


def pickup(payload: Payload) -> None:
    tasks.pickup(**payload)


def burn(payload: Payload) -> None:
    tasks.burn(**payload)


def bomb(payload: Payload) -> None:
    tasks.bomb(**payload)


def hang(payload: Payload) -> None:
    tasks.hang(**payload)


def long(payload: Payload) -> None:
    tasks.long(**payload)


def short(payload: Payload) -> None:
    tasks.short(**payload)


def crash(payload: Payload) -> None:
    tasks.crash(**payload)


class FleetdSqlite(Peer):
    """fleetd on SQLite, a fresh database file per namespace."""

    name = "fleetd"
    distributions = ("fleetd",)
    memory_feature = f"memory_limit {MEMORY_LIMIT_MIB} MiB (RSS watchdog, rlimit, cgroup)"
    time_limit_feature = "timeout (per pool)"
    drain_feature = "grace_period 5 s, then kill and release"
    engine: ClassVar[str] = "sqlite"

    def setup(self) -> None:
        from stress.bench_e2e import write_fleet
        from supervisor.client import Client

        handlers = ", ".join(f'{t} = "{__name__}:{t}"' for t in tasks.TASKS)
        self.config = write_fleet(
            self.ns.folder,
            self.database_url(),
            f"""
[pools.bench]
handlers = {{ {handlers} }}
min_workers = {WORKERS}
max_workers = {WORKERS}
memory_limit = "{MEMORY_LIMIT_MIB}MiB"
timeout = "{self.time_limit:g}s"
""",
        )
        self.client = Client.from_config(self.config)

    def database_url(self) -> str:
        return f"sqlite:///{self.ns.folder}/fleetd.db"

    def enqueue(self, task: str, **kwargs: Any) -> str:
        return str(self.client.enqueue(task, kwargs))

    def enqueue_many(self, task: str, kwargs: list[dict[str, Any]]) -> list[str]:
        return [str(i) for i in self.client.enqueue_many([(task, kw) for kw in kwargs])]

    def commands(self) -> list[list[str]]:
        return [[bin_path("fleetd"), "start", "-c", str(self.config)]]

    def fate(self, job_id: str) -> Fate:
        job = self.client.get(int(job_id))
        text = job.state.value
        if job.error_kind:
            text += f" ({job.error_kind.value})"
        text += f", {job.attempts} deliver{'y' if job.attempts == 1 else 'ies'}"
        return Fate(text, job.state.value in ("done", "dead"))

    def teardown(self) -> None:
        self.client.close()


class FleetdPostgres(FleetdSqlite):
    """fleetd on PostgreSQL, a fresh schema per namespace."""

    name = "fleetd-pg"
    distributions = ("fleetd", "psycopg")
    engine = "postgres"
    runs_faults = False  # fault handling is the supervisor's, the same on either engine

    def database_url(self) -> str:
        from stress.peers import schema_url

        return schema_url(self.ns.postgres_url, self.ns.name)

    def setup(self) -> None:
        from stress.peers import recreate_schema

        recreate_schema(self.ns.postgres_url, self.ns.name)
        super().setup()

    def teardown(self) -> None:
        from stress.peers import recreate_schema

        super().teardown()
        recreate_schema(self.ns.postgres_url, self.ns.name, drop_only=True)
