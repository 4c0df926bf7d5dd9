"""What a pool shares, and with whom: fleet-wide caps per kind, rate limits per kind, tenant
weights and fair share. Their tables; the rules that tie them to the pool's other keys are
PoolConfig's (supervisor/config/pool.py), checked once every field has its value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BeforeValidator

from supervisor.config.handlers import check_kind_table
from supervisor.config.values import Positive, Problem, check_rate
from supervisor.model import NAME_MAX

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
