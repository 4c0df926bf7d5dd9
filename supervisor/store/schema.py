"""The one schema both dialects share (SQLAlchemy Core).

Time columns hold Unix seconds (double precision) in UTC. One representation for both dialects
keeps every comparison a plain number comparison, needs no timezone handling in SQLite (which
has no date type), and makes every index below usable by the range scans the verbs do.

Indexes are shaped for the statements that run all the time, so their cost stays flat however
many jobs are queued:

- ``ix_jobs_claim``: the claim's ordered scan (pool, priority, available_at, id) over queued rows
  only; partial, so finished rows never slow it down.
- ``ix_jobs_ready_age``: the oldest ready job per pool (``min(available_at)``), the number that
  pages. Without it that query reads every queued row.
- ``ix_jobs_lease``: the reaper's scan of expired leases, over leased rows only.
- ``ix_jobs_finished``: prune of done jobs past the retention, and the recent-completions window.
- ``ix_jobs_state`` (SQLite) or ``ix_jobs_queued`` and ``ix_jobs_dead`` (PostgreSQL, migration
  4): listing and counting by state; on PostgreSQL leased and done rows are listed and counted
  through ``ix_jobs_leased`` and ``ix_jobs_finished``. Why per dialect: at the indexes below.
- ``uq_jobs_kind_key`` (SQLite) or ``uq_jobs_key`` (PostgreSQL, migration 4, over keyed rows
  only): the idempotency key, unique per kind (NULL keys never collide).
- ``ix_jobs_tenant_claim`` (migration 3): the capped, fair claim's scans over queued rows: one
  probe per distinct tenant of a pool (a skip scan), then each tenant's first rows in claim
  order. Jobs without a tenant are the tenant ``''`` (``TENANT``), so the index covers them.
- ``ix_jobs_leased`` (migration 3): the capped claim's count of a pool's leased jobs per tenant
  and kind, over leased rows only.

``fleetd_retry_budget`` (migration 3) holds each pool's retry-budget counters in ``BUDGET_BUCKET``
wide time buckets (supervisor/store/budget.py). ``fleetd_rate_buckets`` (migration 7) holds the
token buckets of rate-limited pools (supervisor/store/rated.py).
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    func,
    literal_column,
    text,
)

metadata = MetaData()

# SQLite only auto-increments an INTEGER PRIMARY KEY; PostgreSQL wants BIGINT for a busy queue.
_Id = BigInteger().with_variant(Integer(), "sqlite")
_Time = Float(precision=53)  # DOUBLE PRECISION on PostgreSQL, REAL on SQLite: Unix seconds

jobs = Table(
    "fleetd_jobs",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("kind", String(200), nullable=False),
    Column("pool", String(200), nullable=False),
    Column("state", String(16), nullable=False),
    Column("payload", Text, nullable=False),
    Column("tenant", String(200)),
    Column("key", String(500)),
    Column("priority", Integer, nullable=False, server_default=text("0")),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("max_deliveries", Integer, nullable=False),
    Column("enqueued_at", _Time, nullable=False),
    Column("available_at", _Time, nullable=False),
    Column("owner", String(200)),
    Column("lease_token", String(64)),
    Column("locked_until", _Time),
    Column("extensions", Integer, nullable=False, server_default=text("0")),
    Column("started_at", _Time),
    Column("finished_at", _Time),
    Column("duration", _Time),
    Column("result", Text),
    Column("last_error", Text),
    Column("error_kind", String(32)),
    Column("peak_rss", BigInteger),
    # Migration 6: when a cancel was asked while the job was leased. Any end of that delivery
    # (ack, fail, release, reap) then makes the job cancelled instead of done, queued or dead.
    Column("cancel_requested_at", _Time),
    # Never reuse an id, even after the newest jobs are pruned: a client may still wait on it.
    sqlite_autoincrement=True,
)


def _partial(condition: str) -> dict[str, object]:
    """The same partial-index predicate for both dialects."""
    return {"sqlite_where": text(condition), "postgresql_where": text(condition)}


Index(
    "ix_jobs_claim",
    jobs.c.pool,
    jobs.c.priority.desc(),
    jobs.c.available_at,
    jobs.c.id,
    **_partial("state = 'queued'"),
)
Index("ix_jobs_ready_age", jobs.c.pool, jobs.c.available_at, **_partial("state = 'queued'"))
Index("ix_jobs_lease", jobs.c.locked_until, **_partial("state = 'leased'"))
Index("ix_jobs_finished", jobs.c.pool, jobs.c.finished_at, **_partial("state = 'done'"))
# Listing and counting by state, and the idempotency key: per dialect, because the engines
# maintain indexes differently. PostgreSQL adds an entry to every index whose predicate the new
# row version matches on each update that changes an indexed column (a state change always
# does), so an index over every row costs each claim and each ack an insertion there: it gets
# partial indexes (migration 4), queued and dead rows by pool (leased and done rows are found
# through ix_jobs_leased and ix_jobs_finished), and the key over keyed rows only. SQLite
# rewrites only the indexes whose columns change, and counts a state only from an index that
# has the state as a column (covering), so it keeps the indexes over every row.
ix_jobs_state = Index("ix_jobs_state", jobs.c.state, jobs.c.pool, jobs.c.id).ddl_if(
    dialect="sqlite"
)
ix_jobs_queued = Index(
    "ix_jobs_queued", jobs.c.pool, jobs.c.id, **_partial("state = 'queued'")
).ddl_if(dialect="postgresql")
ix_jobs_dead = Index("ix_jobs_dead", jobs.c.pool, jobs.c.id, **_partial("state = 'dead'")).ddl_if(
    dialect="postgresql"
)
# The idempotency key, unique per kind (NULL keys never collide). Inserts name the conflict
# target with this predicate, which both engines match to either index. A PostgreSQL database
# made before migration 4 keeps uq_jobs_kind_key beside uq_jobs_key: a node still running older
# code names (kind, key) without the predicate, which only the full index matches (see
# migrations._v4_postgres_partial_indexes).
KEYED = "key IS NOT NULL"
uq_jobs_kind_key = Index("uq_jobs_kind_key", jobs.c.kind, jobs.c.key, unique=True).ddl_if(
    dialect="sqlite"
)
uq_jobs_key = Index("uq_jobs_key", jobs.c.kind, jobs.c.key, unique=True, **_partial(KEYED)).ddl_if(
    dialect="postgresql"
)

# The tenant as the capped claim groups it: no tenant is the tenant ''. A literal, not a bound
# parameter: SQLite uses an expression index only for the very same expression.
TENANT = func.coalesce(jobs.c.tenant, literal_column("''"))
ix_jobs_tenant_claim = Index(
    "ix_jobs_tenant_claim",
    jobs.c.pool,
    TENANT,
    jobs.c.priority.desc(),
    jobs.c.available_at,
    jobs.c.id,
    **_partial("state = 'queued'"),
)
# The capped claim's count of a pool's leased jobs per tenant and kind: a handful of rows, read
# from this small index alone. Without it, once statistics exist (ANALYZE, autovacuum), both
# planners may read the whole table for it (13 ms at 100,000 rows on SQLite).
ix_jobs_leased = Index(
    "ix_jobs_leased", jobs.c.pool, TENANT, jobs.c.kind, **_partial("state = 'leased'")
)

# Migration 6: what each supervisor reads several times a second, the leases it holds whose
# cancel was requested (a handful of rows, usually none), and cancelled jobs by finish time
# (prune, counts, listing). Partial, so neither grows with the rest of the table.
CANCEL_ASKED = "state = 'leased' AND cancel_requested_at IS NOT NULL"
ix_jobs_cancel = Index("ix_jobs_cancel", jobs.c.owner, **_partial(CANCEL_ASKED))
ix_jobs_cancelled = Index(
    "ix_jobs_cancelled", jobs.c.pool, jobs.c.finished_at, **_partial("state = 'cancelled'")
)

nodes = Table(
    "fleetd_nodes",
    metadata,
    Column("node_id", String(200), primary_key=True),
    Column("hostname", String(200), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("fleet", String(200), nullable=False),
    Column("started_at", _Time, nullable=False),
    Column("heartbeat_at", _Time, nullable=False),
    Column("state", String(16), nullable=False),  # running, draining, stopped
    Column("snapshot", Text),  # the supervisor's latest FleetSnapshot as JSON
)

schema_version = Table(
    "fleetd_schema_version",
    metadata,
    Column("version", Integer, primary_key=True),
    Column("applied_at", _Time, nullable=False),
)

BUDGET_BUCKET = 10.0  # seconds per retry-budget bucket

retry_budget = Table(
    "fleetd_retry_budget",
    metadata,
    Column("pool", String(200), primary_key=True),
    Column("bucket", BigInteger, primary_key=True, autoincrement=False),  # floor(now / 10 s)
    Column("deliveries", Integer, nullable=False, server_default=text("0")),  # claims
    Column("retries", Integer, nullable=False, server_default=text("0")),  # retried at once
    Column("deferred", Integer, nullable=False, server_default=text("0")),  # past the budget
)

# Schedules (migration 5; supervisor/store/schedule_table.py). One row per schedule name:
# ``through`` is the compare-and-set point every supervisor advances (each tick at or before
# it is decided), ``last_tick`` / ``last_job_id`` the latest tick enqueued, ``timing`` the
# timing its ticks are decided by (``Timing.fingerprint``) and ``timing_at`` when it was set:
# a changed timing starts afresh then. Ticks are Unix seconds like every other time column.
schedules = Table(
    "fleetd_schedules",
    metadata,
    Column("name", String(200), primary_key=True),
    Column("created_at", _Time, nullable=False),  # first seen: no tick before it is due
    Column("through", _Time, nullable=False),
    Column("timing", Text, nullable=False),
    Column("timing_at", _Time, nullable=False),
    Column("last_tick", _Time),
    Column("last_job_id", BigInteger),
    Column("missed", BigInteger, nullable=False, server_default=text("0")),
    Column("last_success_at", _Time),
    Column("updated_at", _Time, nullable=False),
)

# The last ``TICKS_KEPT`` ticks enqueued per schedule, with their jobs: whether the last one
# is still queued or running (overlap), and when one last finished done, even while a later
# tick's job runs.
TICKS_KEPT = 10
schedule_ticks = Table(
    "fleetd_schedule_ticks",
    metadata,
    Column("schedule", String(200), primary_key=True),
    Column("tick", _Time, primary_key=True),
    Column("job_id", BigInteger, nullable=False),
)

# Pauses (migration 6; supervisor/store/controls.py). One row per paused pool (``kind`` is
# ``ALL_KINDS``) or paused kind of a pool: no supervisor claims a job it covers.
ALL_KINDS = ""
pauses = Table(
    "fleetd_pauses",
    metadata,
    Column("pool", String(200), primary_key=True),
    Column("kind", String(200), primary_key=True),
    Column("paused_at", _Time, nullable=False),
)

# Rate limits (migration 7; supervisor/store/rated.py): one token bucket per rate-limited pool
# (kind '') and per limited kind of it, spent by every host's claims. ``tokens`` were counted at
# ``counted_at`` (the claim's clock); the level now is computed from them (supervisor/rates.py).
rate_buckets = Table(
    "fleetd_rate_buckets",
    metadata,
    Column("pool", String(200), primary_key=True),
    Column("kind", String(200), primary_key=True),
    Column("tokens", _Time, nullable=False),
    Column("counted_at", _Time, nullable=False),
)
