"""Untrusted input: parse an uploaded file (the poison pool's limits contain what it does)."""

from __future__ import annotations

from typing import Any

from workers import Permanent


def parse(payload: dict[str, Any]) -> dict[str, Any]:
    name = str(payload.get("upload", ""))
    if not name.endswith((".pdf", ".csv")):
        raise Permanent(f"unsupported upload {name!r}")
    return {"parsed": name}
