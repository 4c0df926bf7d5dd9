"""Work that waits on a third-party API (its own pool, capped by max_inflight)."""

from __future__ import annotations

import time
from typing import Any


def call_api(payload: dict[str, Any]) -> dict[str, Any]:
    time.sleep(float(payload.get("latency", 0.05)))  # stands in for the HTTP call
    return {"enriched": payload.get("id")}
