"""Interactive work: a thumbnail someone is waiting for."""

from __future__ import annotations

from typing import Any


def thumbnail(payload: dict[str, Any]) -> dict[str, Any]:
    return {"image": payload.get("image"), "size": "128x128"}
