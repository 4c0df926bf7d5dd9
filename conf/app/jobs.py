"""Bulk work: re-index a tenant."""

from __future__ import annotations

from typing import Any

from workers import Permanent, current_job


def reindex(payload: dict[str, Any]) -> dict[str, Any]:
    if "tenant" not in payload:
        raise Permanent("payload has no 'tenant'")
    return {"tenant": payload["tenant"], "attempt": current_job().attempt}
