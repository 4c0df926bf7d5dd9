"""The queues ``python -m stress bench`` runs side by side: fleetd and the ones a user would
pick instead (Celery, RQ, Dramatiq, procrastinate), one small module each.

Each module has two sides. The *worker side* is what the peer's own command line imports
(``celery -A stress.peers.celery_peer``, ``dramatiq stress.peers.dramatiq_peer:broker``, ...):
an app or broker built at import time from ``BENCH_*`` environment variables, with the job
bodies of ``stress.peers.tasks`` declared the peer's own way. The *harness side* is a
``Peer`` subclass: fresh namespace, enqueue, the commands that start its workers, and the
peer's own view of a job's fate.

A peer is optional: ``installed`` looks at the installed distributions without importing
anything, so a missing peer is a table row saying so, never an ImportError.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, ClassVar

ROOT = Path(__file__).resolve().parents[2]
WORKERS = 2  # worker processes per peer, in every workload
TIME_LIMIT = 5.0  # seconds: each peer's per-job time limit, where it has one
MEMORY_LIMIT_MIB = 256  # each peer's memory feature, where it has one


@dataclass(frozen=True)
class Namespace:
    """Where one measurement lives: a name unique to it (queue, key prefix, schema), a folder
    and the marker file the job bodies write to."""

    name: str
    folder: Path
    redis_url: str
    postgres_url: str

    @property
    def marker(self) -> str:
        return str(self.folder / "marker")

    def env(self) -> dict[str, str]:
        """What a worker process needs to build the same app as the harness."""
        return {
            **os.environ,
            "BENCH_NS": self.name,
            "BENCH_REDIS_URL": self.redis_url,
            "BENCH_POSTGRES_URL": self.postgres_url,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }


@dataclass(frozen=True)
class Fate:
    """A job as its queue sees it: a short text, and whether the queue is done with it."""

    text: str
    final: bool


class Peer(ABC):
    """One queue under test, bound to one namespace."""

    name: ClassVar[str]
    distributions: ClassVar[tuple[str, ...]]  # must be installed; the first gives the version
    memory_feature: ClassVar[str]  # what it offers against a memory bomb, as configured here
    time_limit_feature: ClassVar[str]  # what it offers against a hang, as configured here
    drain_feature: ClassVar[str]  # what SIGTERM does, as documented / configured here
    runs_faults: ClassVar[bool] = True

    def __init__(self, ns: Namespace, time_limit: float = TIME_LIMIT) -> None:
        self.ns = ns
        self.time_limit = time_limit  # the drain's long job needs more than TIME_LIMIT

    def env(self) -> dict[str, str]:
        """The environment of the worker processes: the namespace and the time limit."""
        return {**self.ns.env(), "BENCH_TIME_LIMIT": str(self.time_limit)}

    @abstractmethod
    def setup(self) -> None:
        """Make the namespace fresh (a schema, a database) and open the peer's client."""

    @abstractmethod
    def enqueue(self, task: str, **kwargs: Any) -> str:
        """Enqueue one job of ``task`` (a name from ``tasks.TASKS``); its id, as text."""

    def enqueue_many(self, task: str, kwargs: list[dict[str, Any]]) -> list[str]:
        """Enqueue many; the peer's bulk API where it has one."""
        return [self.enqueue(task, **kw) for kw in kwargs]

    @abstractmethod
    def commands(self) -> list[list[str]]:
        """The command lines a user would run to start ``WORKERS`` worker processes; each
        becomes one subprocess (its own session), SIGTERMed on a drain."""

    @abstractmethod
    def fate(self, job_id: str) -> Fate:
        """The job as the queue reports it now."""

    @abstractmethod
    def teardown(self) -> None:
        """Close the client and remove the namespace (keys, schema)."""


@dataclass(frozen=True)
class PeerSpec:
    """Where a peer lives and what it needs installed, known without importing it."""

    name: str
    module: str
    cls: str
    distributions: tuple[str, ...]

    def version(self) -> str | None:
        """The first distribution's version, or None when any of them is missing."""
        try:
            versions = [metadata.version(d) for d in self.distributions]
        except metadata.PackageNotFoundError:
            return None
        return versions[0]

    def load(self) -> type[Peer]:
        return getattr(importlib.import_module(self.module), self.cls)


PEERS: dict[str, PeerSpec] = {
    s.name: s
    for s in (
        PeerSpec("fleetd", "stress.peers.fleetd_peer", "FleetdSqlite", ("fleetd",)),
        PeerSpec("fleetd-pg", "stress.peers.fleetd_peer", "FleetdPostgres", ("fleetd", "psycopg")),
        PeerSpec("celery", "stress.peers.celery_peer", "CeleryPeer", ("celery", "redis")),
        PeerSpec("rq", "stress.peers.rq_peer", "RqPeer", ("rq",)),
        PeerSpec("dramatiq", "stress.peers.dramatiq_peer", "DramatiqPeer", ("dramatiq", "redis")),
        PeerSpec(
            "procrastinate",
            "stress.peers.procrastinate_peer",
            "ProcrastinatePeer",
            ("procrastinate", "psycopg"),
        ),
    )
}


def bin_path(command: str) -> str:
    """The console script of this interpreter's environment (``celery``, ``rq``, ...)."""
    return str(Path(sys.executable).parent / command)


@dataclass(frozen=True)
class WorkerEnv:
    """The worker side's settings, as ``Peer.env`` passed them."""

    ns: str
    redis_url: str
    postgres_url: str
    time_limit: float

    @classmethod
    def read(cls) -> WorkerEnv:
        return cls(
            os.environ.get("BENCH_NS", "bench_unset"),
            os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"),
            os.environ.get("BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1/test"),
            float(os.environ.get("BENCH_TIME_LIMIT", TIME_LIMIT)),
        )


def schema_url(base: str, schema: str) -> str:
    """``base`` with ``schema`` first on the search_path: one namespace per measurement."""
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}options=-csearch_path%3D{schema}"


def recreate_schema(base: str, schema: str, *, drop_only: bool = False) -> None:
    """Drop ``schema`` (and everything in it) and, unless ``drop_only``, create it empty."""
    import psycopg

    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        if not drop_only:
            conn.execute(f'CREATE SCHEMA "{schema}"')


def drop_redis_keys(url: str, prefix: str) -> None:
    """Delete every key under ``prefix`` (a namespace's keys and nothing else)."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        batch = list(client.scan_iter(match=f"{prefix}*", count=1000))
        for i in range(0, len(batch), 500):
            client.delete(*batch[i : i + 500])
    finally:
        client.close()


def short_error(text: str, width: int = 60) -> str:
    """An error line for a table cell: the exception's class without its module, the
    message cut to ``width``."""
    match = re.match(r"^([\w.]+): (.*)$", text.strip(), re.S)
    if match:
        text = f"{match.group(1).rsplit('.', 1)[-1]}: {match.group(2)}"
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."
