"""What a pool shares, and with whom: fleet-wide caps per kind, rate limits per kind, tenant
weights and fair share, slots. Their tables, and the rules that tie them to the pool's other keys
(PoolConfig's validators call these once every field has its value).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BeforeValidator

from supervisor.config_handlers import check_kind_table
from supervisor.config_values import Positive, Problem, check_rate
from supervisor.model import NAME_MAX
from workers.command import CommandSpec

if TYPE_CHECKING:
    from supervisor.config_pool import PoolConfig

KindCaps = Annotated[dict[str, Positive], BeforeValidator(check_kind_table)]
KindRates = Annotated[
    dict[str, Annotated[float, BeforeValidator(check_rate)]], BeforeValidator(check_kind_table)
]


# A weight's bounds: the fair order divides a slot by the weight (fair.slot_key), which for a
# weight as small as 1e-310 overflows and fails every claim of the pool; beyond a million to
# one (either way) a share means nothing a pool of a few hundred slots could show.
WEIGHT_MIN, WEIGHT_MAX = 0.001, 1_000_000


def check_weight(value: Any) -> float:
    """A tenant's weight: a finite number from WEIGHT_MIN to WEIGHT_MAX."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{value!r} is not a weight (expected a number above zero, e.g. 3)")
    if value == float("inf"):
        raise ValueError(f"{value!r} is not a weight (expected a finite number, e.g. 3)")
    if not WEIGHT_MIN <= value <= WEIGHT_MAX:
        expected = f"from {WEIGHT_MIN:g} to {WEIGHT_MAX:,}, e.g. 3"
        raise ValueError(f"{value!r} is out of range for a weight (expected {expected})")
    return float(value)


def check_weight_table(value: Any) -> Any:
    """``{ tenant = weight }``: tenants as enqueue takes them (``""`` is jobs without one)."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{value!r} is not a table (expected {{ tenant = weight, ... }})")
    for tenant, weight in value.items():
        if len(tenant) > NAME_MAX or any(c.isspace() or not c.isprintable() for c in tenant):
            message = f"{tenant!r} is not a tenant (expected a name without spaces)"
            raise Problem(message, (tenant,))
        try:
            check_weight(weight)
        except ValueError as exc:
            raise Problem(str(exc), (tenant,)) from None
    return value


TenantWeights = Annotated[
    dict[str, Annotated[float, BeforeValidator(check_weight)]], BeforeValidator(check_weight_table)
]


def slots_fit(pool: PoolConfig) -> None:
    """``slots`` above 1 needs an io pool, no soft timeout, room in nproc_limit for its threads
    and no command handler."""
    # A thread cannot be killed, and a command's runner kills every process of the
    # worker when its job ends (workers.tree.end_all): both need one job per worker.
    if pool.slots > 1 and pool.bound != "io":
        raise Problem(
            f'{pool.slots} needs bound = "io" (a cpu pool runs one job per worker)',
            ("slots",),
        )
    if pool.slots > 1 and pool.soft_timeout > 0:
        raise Problem(
            f"{pool.slots} cannot raise SoftTimeout in a slot's thread (a signal reaches "
            "only a worker's main thread): set soft_timeout = 0 (expected 1)",
            ("slots",),
        )
    if pool.slots > 1 and pool.nproc_limit is not None and pool.nproc_limit <= pool.slots + 1:
        # RLIMIT_NPROC counts threads: a slot's thread could not start
        raise Problem(
            f"{pool.slots} threads do not fit nproc_limit {pool.nproc_limit} (it counts "
            f"threads: the worker needs at least {pool.slots + 2})",
            ("slots",),
        )
    commands = [k for k, h in pool.handlers.items() if isinstance(h, CommandSpec)]
    if pool.slots > 1 and commands:
        raise Problem(
            f"{pool.slots} cannot run command handlers ({', '.join(commands)}): a "
            "command's end kills every process of its worker (expected 1)",
            ("slots",),
        )


def kinds_known(pool: PoolConfig, key: str) -> None:
    """Each kind of the ``key`` table (kind_max_inflight, kind_rate_limit) is one of the pool's."""
    for kind in getattr(pool, key):
        if kind not in pool.handlers:
            known = ", ".join(map(repr, pool.handlers))
            message = f"{kind!r} is not a kind of this pool (expected one of {known})"
            raise Problem(message, (key, kind))


def burst_has_rate(pool: PoolConfig) -> None:
    """``rate_burst`` says how many starts ``rate_limit`` lets through at once: not without it."""
    if pool.rate_burst is not None and pool.rate_limit is None:
        message = f"{pool.rate_burst!r} is set without a rate (expected rate_limit too)"
        raise Problem(message, ("rate_burst",))


def fair_keys(pool: PoolConfig) -> None:
    """``fair = false`` with a cap, or with ``tenant_weights``, would be a key without effect:
    a capped claim always orders fairly (fair.py), and weights are the fair order's."""
    if pool.fair:
        return
    caps = ("max_inflight", "tenant_max_inflight", "kind_max_inflight")
    cap = next((k for k in caps if getattr(pool, k)), None)
    if cap is not None:
        message = f"false with {cap} set (expected true: a pool with caps always claims fairly)"
        raise Problem(message, ("fair",))
    if pool.tenant_weights:
        message = "false with tenant_weights set (expected true: weights order the fair claim)"
        raise Problem(message, ("fair",))
