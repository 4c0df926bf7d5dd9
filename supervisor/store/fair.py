"""The fair claim: weighted fair shares between tenants, and fleet-wide caps per pool, tenant
and kind.

``SqlStore.claim`` runs these steps for a pool with caps, and for a fair pool (``fair``, the
default) whose queue holds more than one tenant (``one_tenant``, ``tenants_differ``: two index
probes; with one tenant or none, fair order is the plain claim's order and the plain statement
serves, see ``SqlStore.claim_rows``). One transaction, serialised per pool (SQLite: ``BEGIN
IMMEDIATE``, the database's one writer; PostgreSQL: an advisory lock keyed on the pool,
``PostgresStore._lock_claims``), so two hosts never both see room for the same slot, and the
running counts a claim orders by stay true until it has leased:

1. ``leased_stmt``: the pool's leased jobs counted per (tenant, kind), from a small partial
   index. Leased rows are few (at most the caps), so this is cheap however deep the queue.
2. ``gather`` (``candidates_stmt``): a window of up to ``WINDOW`` tenants with queued jobs,
   found by a skip scan (one index probe per distinct tenant, not one per job), starting after
   the round-robin cursor; for each, its first ``k`` ready jobs in claim order, ``k`` being what
   one claim could ever take from one tenant. Tenants at their cap, and kinds at theirs, are
   left out in SQL; the window is widened by the number of tenants at their cap, which are
   probed but not read (there are at most leased / tenant_max_inflight of them). Cost:
   O((WINDOW + full tenants) + WINDOW × k), flat in queue depth and in the number of tenants.
3. ``pick``: the fair order within the room left (pure Python, tested on its own). The window
   is read first with one row per tenant; only when those heads cannot decide the pick
   (``heads_decide``: few tenants, or uneven running counts) is it read again with ``k``.
4. The chosen ids are leased (``CappedClaims._take_stmt``), exactly as the plain claim leases.

Fair order (weighted). A tenant ``t`` has a weight ``w`` (``tenant_weights``; 1 when not
listed) and ``R`` jobs leased now, fleet-wide. Its r-th candidate (r = 1, 2, ... in its own
priority-then-FIFO order) would be its slot ``s = R + r``, and gets the sort key

    (level, turn in level, -priority, round-robin turn, r)
    level         = 1 + floor((s - 1) / w)      which "round" the slot belongs to
    turn in level = s - ceil((level - 1) * w)   1 for the tenant's first slot in that round

(``slot_key``). Lowest key first. A round gives each tenant ``w`` slots (``w`` on average, for
a weight that is not a whole number: 0.5 is a slot every other round), and within a round
every tenant's first slot comes before any tenant's second: a round robin that gives a tenant
of weight 3 three turns to a weight-1 tenant's one. So, while both have backlog, a pool whose
slots fill whole rounds runs them in the ratio of their weights (8 slots, weights 3 and 1: 6
and 2); a partial round is handed out turn by turn (2 slots, weights 3 and 1: one each, never
two and none). With every weight 1 the key is the tenant's position ``R + r``, as for equal
shares.

What the key promises: a tenant with nothing leased has its first job at level 1 and turn 1,
ahead of every tenant that already runs a job (level 1, turn 2 or more, or a higher level):
a tenant with 100,000 queued jobs and three running waits while a tenant with ten queued and
none running gets a slot. Priority orders jobs within a tenant and breaks ties between
tenants at the same (level, turn); it never gives one tenant a slot ahead of another tenant's
earlier turn. Then the round-robin turn: tenants in the order they come after the cursor (the
tenant last served). Jobs without a tenant share the tenant ``''`` (weight 1 unless
listed). The cursor is kept per store (per host), so hosts take turns from their own
positions; ``R``, read from the database, is shared, so the order holds across hosts.

Why levels and not the plain ratio ``(R + r) / w``: positions by ratio starve a light tenant
whenever the pool has fewer slots than the weights add up to (2 slots, weights 3 and 1: after
each of the heavy tenant's jobs its next is at 2/3, always ahead of the light tenant's 1). Why
running counts and not a start count (stride scheduling): running counts are in the database,
the same for every host and every claim, with no state to store or age; the price is that
shares are of slots held now, not of jobs started over time (equal when jobs take equal time).

Kind caps and the bound ``k``: if a tenant's first ``k`` rows were read across all kinds, rows
of a kind capped at 1 could fill them and hide the rows that could be taken. So each capped
kind with room is read on its own, at most its room per tenant, and the other kinds together
(``kind_groups``): one more statement per capped kind, over the same window of tenants.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Integer,
    String,
    Table,
    and_,
    bindparam,
    case,
    func,
    literal,
    literal_column,
    or_,
    select,
    true,
)
from sqlalchemy.sql.elements import ColumnElement

from supervisor.model import ClaimLimits, JobState
from supervisor.store.schema import TENANT, jobs

QUEUED, LEASED = JobState.QUEUED.value, JobState.LEASED.value
# Tenants one claim looks at (``gather``). Claim cost is O(WINDOW × k): 64 tenants keep a capped
# claim within a few milliseconds however many tenants queue (docs/architecture.md).
WINDOW = 64


@dataclass(frozen=True, slots=True)
class Running:
    """The pool's leased jobs when the claim started: in total, per tenant, per kind."""

    total: int = 0
    tenants: Counter[str] | None = None
    kinds: Counter[str] | None = None
    # per tenant: leased jobs the claiming node has seen end, whose results it has not written
    # yet (they are written after this claim). Caps count them (their leases are held until
    # written); the fair order does not (``placed``): a claim sent in the same loop pass as
    # those results would otherwise see the tenants that just finished as still running
    finished: Mapping[str, int] | None = None

    @classmethod
    def of(cls, rows: Iterable[Any], finished: Mapping[str, int] | None = None) -> Running:
        """From ``leased_stmt`` rows (tenant, kind, count)."""
        tenants: Counter[str] = Counter()
        kinds: Counter[str] = Counter()
        for tenant, kind, count in rows:
            tenants[tenant] += count
            kinds[kind] += count
        return cls(sum(tenants.values()), tenants, kinds, finished)

    def placed(self, tenant: str) -> int:
        """``R`` of the fair order: the tenant's leased jobs less those that ended here.

        >>> Running(3, Counter(a=3), finished={"a": 2, "b": 1}).placed("a")
        1
        """
        leased = (self.tenants or Counter())[tenant]
        return max(0, leased - (self.finished or {}).get(tenant, 0))

    def room(self, limits: ClaimLimits, n: int) -> int:
        """How many jobs this claim may take at most."""
        if limits.max_inflight is None:
            return n
        return max(0, min(n, limits.max_inflight - self.total))

    def full_tenants(self, limits: ClaimLimits) -> list[str]:
        cap = limits.tenant_max_inflight
        return [] if cap is None else sorted(t for t, c in (self.tenants or {}).items() if c >= cap)

    def open_kinds(self, limits: ClaimLimits, kinds: Iterable[str]) -> list[str]:
        caps, running = limits.kind_max_inflight, self.kinds or Counter()
        return sorted(k for k in kinds if k not in caps or running[k] < caps[k])


@dataclass(frozen=True, slots=True)
class Candidate:
    """A ready job the claim may take."""

    id: int
    tenant: str
    kind: str
    priority: int
    available_at: float


@dataclass(frozen=True, slots=True)
class Window:
    """What one claim looks at: candidates, and the tenants visited in round-robin order (from
    the one after the cursor on). ``full``: the window held ``WINDOW`` tenants, so there may be
    more beyond it."""

    candidates: list[Candidate]
    tenants: list[str]
    full: bool = False

    def next_cursor(self, taken: Sequence[Candidate]) -> str | None:
        """Where the next claim's round starts: after the last tenant served in this one; when
        none was, after this window (if there is more beyond it) or at the first tenant."""
        served = {c.tenant for c in taken}
        for tenant in reversed(self.tenants):
            if tenant in served:
                return tenant
        return self.tenants[-1] if self.full and self.tenants else None


# Float weights: a slot exactly on a round's boundary must not fall into the next round
# because (s - 1) / w came out a hair above a whole number.
_EPS = 1e-9


def slot_key(running: int, rank: int, weight: float) -> tuple[int, int]:
    """(level, turn in level) of a tenant's ``rank``-th candidate, the tenant running
    ``running`` jobs with ``weight`` (module docstring).

    >>> [slot_key(0, r, 3) for r in (1, 2, 3, 4)]
    [(1, 1), (1, 2), (1, 3), (2, 1)]
    >>> [slot_key(0, r, 1) for r in (1, 2)], [slot_key(0, r, 0.5) for r in (1, 2)]
    ([(1, 1), (2, 1)], [(1, 1), (3, 1)])
    """
    s = running + rank
    level = 1 + math.floor((s - 1) / weight + _EPS)
    return level, s - math.ceil((level - 1) * weight - _EPS)


def per_tenant(limits: ClaimLimits, room: int) -> int:
    """``k``: the most one claim can take from one tenant, so the most worth reading."""
    cap = limits.tenant_max_inflight
    return room if cap is None else min(room, cap)


def heads_decide(
    window: Window,
    running: Running,
    limits: ClaimLimits,
    kinds: Sequence[str],
    room: int,
    taken: Sequence[Candidate],
) -> bool:
    """Whether ``taken``, picked from each tenant's first row only, is what the full read of
    ``k`` rows per tenant would pick, so the claim can skip that read. True when one row per
    tenant is all there is to read (``k`` = 1), or when the heads filled the room with positions
    below every tenant's second row (``running + 2``): no unread row can come before them. Not
    decided with kind caps (their groups interleave within a tenant). With many tenants in the
    window the heads nearly always decide, which cuts the read from WINDOW × k rows to WINDOW.

    >>> w = Window([Candidate(1, "a", "k", 0, 0.0), Candidate(2, "b", "k", 0, 0.0)], ["a", "b"])
    >>> heads_decide(w, Running(), ClaimLimits(max_inflight=9), ["k"], 2, w.candidates)
    True
    >>> heads_decide(w, Running(1, Counter(b=1)), ClaimLimits(max_inflight=9), ["k"], 2,
    ...              w.candidates)
    False
    """
    if per_tenant(limits, room) == 1:
        return True
    if len(kind_groups(running, limits, kinds, 1)) != 1 or len(taken) < room:
        return False
    placed, weight = running.placed, limits.weight
    highest = max(slot_key(placed(c.tenant), 1, weight(c.tenant)) for c in taken)
    return all(highest < slot_key(placed(c.tenant), 2, weight(c.tenant)) for c in window.candidates)


def kind_groups(
    running: Running, limits: ClaimLimits, kinds: Sequence[str], k: int
) -> list[tuple[list[str], int]]:
    """The reads a claim makes, as (kinds, rows per tenant): the uncapped kinds together, ``k``
    rows per tenant; each capped kind with room left on its own, at most that room.

    >>> kind_groups(Running(kinds=Counter(enrich=1)), ClaimLimits(kind_max_inflight={"enrich": 3}),
    ...             ["enrich", "render"], 4)
    [(['render'], 4), (['enrich'], 2)]
    """
    caps, busy = limits.kind_max_inflight, running.kinds or Counter()
    free = [kind for kind in kinds if kind not in caps]
    groups = [(free, k)] if free else []
    for kind in kinds:
        if kind in caps and busy[kind] < caps[kind]:
            groups.append(([kind], min(k, caps[kind] - busy[kind])))
    return groups


def pick(window: Window, running: Running, limits: ClaimLimits, room: int) -> list[Candidate]:
    """The jobs to lease, in weighted fair order (module docstring, ``slot_key``), within the
    room left for the pool, each tenant and each kind.

    >>> w = Window([Candidate(1, "big", "k", 0, 1.0), Candidate(2, "big", "k", 0, 2.0),
    ...             Candidate(9, "small", "k", 0, 5.0)], ["big", "small"])
    >>> [c.id for c in pick(w, Running(3, Counter(big=3)), ClaimLimits(max_inflight=5), 2)]
    [9, 1]
    """
    tenants_running = running.tenants or Counter()
    kinds_running = running.kinds or Counter()
    turn = {tenant: index for index, tenant in enumerate(window.tenants)}
    rank: Counter[str] = Counter()
    ordered = []
    for c in sorted(window.candidates, key=lambda c: (c.tenant, -c.priority, c.available_at, c.id)):
        rank[c.tenant] += 1
        level, within = slot_key(running.placed(c.tenant), rank[c.tenant], limits.weight(c.tenant))
        tie = (-c.priority, turn.get(c.tenant, len(turn)), rank[c.tenant])
        ordered.append(((level, within, *tie), c))
    ordered.sort(key=lambda item: item[0])

    taken: list[Candidate] = []
    per_tenant_taken: Counter[str] = Counter()
    per_kind_taken: Counter[str] = Counter()
    tenant_cap, kind_caps = limits.tenant_max_inflight, limits.kind_max_inflight
    for _, c in ordered:
        if len(taken) >= room:
            break
        if tenant_cap is not None and tenants_running[c.tenant] + per_tenant_taken[c.tenant] >= (
            tenant_cap
        ):
            continue
        cap = kind_caps.get(c.kind)
        if cap is not None and kinds_running[c.kind] + per_kind_taken[c.kind] >= cap:
            continue
        taken.append(c)
        per_tenant_taken[c.tenant] += 1
        per_kind_taken[c.kind] += 1
    return taken


# ---- statements (built once per store, with bind parameters) -----------------------------


def leased_stmt() -> Any:
    """The pool's leased jobs per (tenant, kind). Parameter: ``c_pool``."""
    return (
        select(TENANT.label("tenant"), jobs.c.kind, func.count())
        .where(jobs.c.pool == bindparam("c_pool"), jobs.c.state == LEASED)
        .group_by(TENANT, jobs.c.kind)
    )


def _tenant_of(table: Any) -> ColumnElement[str]:
    """``TENANT`` for an alias of the jobs table (the same expression, so the index serves)."""
    return func.coalesce(table.c.tenant, literal_column("''"))


def _queued_in_pool(table: Any) -> ColumnElement[bool]:
    return and_(table.c.pool == bindparam("c_pool"), table.c.state == QUEUED)


def candidates_stmt(
    now: ColumnElement[float],
    *,
    lateral: bool,
    mostly_true: Callable[[ColumnElement[bool]], ColumnElement[bool]],
) -> Any:
    """A window of at most ``c_tenants`` tenants with queued jobs, in tenant order: the first
    one after ``c_after`` (or the very first when ``c_first`` is 1), then the next ones, up to
    ``c_until`` when ``c_bounded`` is 1. For each, its first ``c_k`` ready jobs of ``c_kinds``
    in claim order, none for the tenants in ``c_full``. Rows: tenant, depth, then id, kind,
    priority, available_at (all NULL for a visited tenant without candidates).

    The tenants come from a recursive CTE that jumps from one distinct tenant to the next through
    ``ix_jobs_tenant_claim`` (a loose index scan; neither engine does it on its own). Each
    tenant's rows are a LIMITed scan of the same index: a LATERAL subquery on PostgreSQL, a
    correlated ``id IN (… LIMIT k)`` on SQLite, which has no LATERAL."""
    first = _next_tenant(jobs.alias("first_t"), None)
    after = _next_tenant(jobs.alias("after_t"), bindparam("c_after", type_=String))
    start = case((bindparam("c_first", type_=Integer) == 1, first), else_=after)
    tenants = select(start.label("tenant"), literal(1, Integer).label("depth")).cte(
        "tenants", recursive=True
    )
    following = _next_tenant(jobs.alias("next_t"), tenants.c.tenant)
    tenants = tenants.union_all(
        select(following, tenants.c.depth + 1).where(
            tenants.c.tenant.is_not(None),
            tenants.c.depth < bindparam("c_tenants", type_=Integer),
        )
    )

    row: Table = jobs.alias("row")
    columns = (row.c.id, row.c.kind, row.c.priority, row.c.available_at) if lateral else (row.c.id,)
    firsts = (
        select(*columns)
        .where(
            _queued_in_pool(row),
            _tenant_of(row) == tenants.c.tenant,
            mostly_true(row.c.available_at <= now),
            row.c.kind.in_(bindparam("c_kinds", expanding=True)),
        )
        .order_by(row.c.priority.desc(), row.c.available_at, row.c.id)
        .limit(bindparam("c_k", type_=Integer))
    )
    not_full = tenants.c.tenant.not_in(bindparam("c_full", expanding=True))
    in_window = and_(
        tenants.c.tenant.is_not(None),
        or_(
            bindparam("c_bounded", type_=Integer) == 0,
            tenants.c.tenant <= bindparam("c_until", type_=String),
        ),
    )
    if lateral:
        c = firsts.where(not_full).lateral("c")
        joined = tenants.outerjoin(c, true())
        found = (c.c.id, c.c.kind, c.c.priority, c.c.available_at)
    else:
        joined = tenants.outerjoin(jobs, and_(not_full, jobs.c.id.in_(firsts)))
        found = (jobs.c.id, jobs.c.kind, jobs.c.priority, jobs.c.available_at)
    return select(tenants.c.tenant, tenants.c.depth, *found).select_from(joined).where(in_window)


def _next_tenant(table: Any, after: ColumnElement[str] | None) -> Any:
    """The first tenant with queued jobs in the pool (after ``after``): one index probe."""
    tenant = _tenant_of(table)
    where = [_queued_in_pool(table)] if after is None else [_queued_in_pool(table), tenant > after]
    return select(tenant).where(*where).order_by(tenant).limit(1).scalar_subquery()


# How long a fair pool's plain claim, having found one tenant queued, runs without its guard
# (``SqlStore.claim_rows``). A claim rate above a few a second pays the guard's two index
# probes on one claim in many; the price is that a second tenant's jobs arriving meanwhile are
# claimed in plain order, behind the first tenant's, for at most this long.
GUARD_EVERY = 0.1


def one_tenant_known(found_at: float | None, now: float) -> bool:
    """Whether the pool's last look, at monotonic ``found_at`` (None: never), that found one
    tenant queued is recent enough to claim without the guard.

    >>> one_tenant_known(None, 5.0), one_tenant_known(5.0, 5.05), one_tenant_known(5.0, 5.2)
    (False, True, False)
    """
    return found_at is not None and now - found_at < GUARD_EVERY


def _tenant_bounds() -> tuple[Any, Any]:
    """The lowest and the highest tenant with queued jobs in the pool ``c_pool`` (NULL when
    none): one probe of ``ix_jobs_tenant_claim`` each, whatever the queue's depth."""
    low, high = jobs.alias("low_t"), jobs.alias("high_t")
    # literals, not bound values: SQLite plans a partial index from a bound value only by
    # preparing the statement again whenever it is bound, on every claim (~0.1 ms)
    queued = literal_column(f"'{QUEUED}'")
    first = select(_tenant_of(low)).where(low.c.pool == bindparam("c_pool"), low.c.state == queued)
    last = select(_tenant_of(high)).where(
        high.c.pool == bindparam("c_pool"), high.c.state == queued
    )
    return (
        first.order_by(_tenant_of(low)).limit(literal_column("1")).scalar_subquery(),
        last.order_by(_tenant_of(high).desc()).limit(literal_column("1")).scalar_subquery(),
    )


def one_tenant() -> ColumnElement[bool]:
    """True while the pool's queued jobs are all one tenant's (NULL, so false, when none is
    queued): the guard of a fair pool's plain claim, under which fair order is plain order."""
    low, high = _tenant_bounds()
    return low == high


def tenants_differ() -> ColumnElement[bool]:
    """True when the pool's queued jobs belong to more than one tenant."""
    low, high = _tenant_bounds()
    return low != high


Run = Callable[[dict[str, Any]], Iterable[Any]]


def gather(run: Run, cursor: str | None, size: int) -> Window:
    """The window of at most ``size`` tenants after ``cursor`` (None: from the first tenant),
    wrapping around to the first tenant at most once, so it never holds a tenant twice; the
    cursor's own tenant comes last. ``run(params)`` executes ``candidates_stmt`` with the
    claim's other parameters. With at most ``size`` tenants, every claim sees them all."""
    whole = {"c_tenants": size, "c_bounded": 0, "c_until": ""}
    if cursor is None:
        rows = sorted(run({**whole, "c_first": 1, "c_after": ""}), key=_depth)
    else:
        rows = sorted(run({**whole, "c_first": 0, "c_after": cursor}), key=_depth)
        room = size - len({r.tenant for r in rows})
        if room > 0:  # ran past the last tenant: go on from the first, up to the cursor
            bounded = {"c_tenants": room, "c_bounded": 1, "c_until": cursor}
            rows += sorted(run({**bounded, "c_first": 1, "c_after": ""}), key=_depth)
    tenants = list(dict.fromkeys(r.tenant for r in rows))
    found = [
        Candidate(r.id, r.tenant, r.kind, r.priority, r.available_at)
        for r in rows
        if r.id is not None
    ]
    return Window(found, tenants, full=len(tenants) >= size)


def _depth(row: Any) -> int:
    return int(row.depth)
