"""Bulk work: render a document."""

from __future__ import annotations

from typing import Any


def render(payload: dict[str, Any]) -> dict[str, Any]:
    return {"doc": payload.get("doc"), "pages": 1}
