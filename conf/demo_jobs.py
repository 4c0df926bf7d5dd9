"""Handlers of the demo fleet (conf/demo.toml). Plain functions: JSON in, JSON out."""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any

from workers import Permanent, current_job


def thumbnail(payload: dict[str, Any]) -> dict[str, Any]:
    """A quick job someone is waiting for."""
    time.sleep(0.05)
    return {"thumb": f"img-{payload.get('image', 0)}-small.png"}


def sync(payload: dict[str, Any]) -> dict[str, Any]:
    """A periodic job (``[schedules.sync]``): the tick it was enqueued for is in the payload."""
    time.sleep(0.02)
    return {"source": payload.get("source"), "synced_for": payload.get("scheduled_for")}


def render(payload: dict[str, Any]) -> dict[str, Any]:
    """A CPU-heavy job: hash a buffer for a while."""
    data = str(payload.get("doc", 0)).encode() * 10_000
    deadline = time.monotonic() + float(payload.get("seconds", 0.3))
    rounds = 0
    while time.monotonic() < deadline:
        data = hashlib.sha256(data).digest() * 1_000
        rounds += 1
    return {"doc": payload.get("doc"), "rounds": rounds}


def flaky(payload: dict[str, Any]) -> str:
    """Fails on its first two deliveries, then succeeds: retries with backoff at work."""
    attempt = current_job().attempt
    if attempt < 3:
        raise ConnectionError(f"downstream timed out (attempt {attempt})")
    return f"succeeded on attempt {attempt}"


def parse_upload(payload: dict[str, Any]) -> Any:
    """Untrusted input: some uploads are bombs, hangs or crashes."""
    what = payload.get("upload", "ok")
    if what == "zip-bomb":  # grows 50 MiB every 50 ms: the RSS watchdog stops it
        hoard = []
        while True:
            hoard.append(bytearray(os.urandom(1)) * (50 * 1024 * 1024))
            time.sleep(0.05)
    if what == "huge-alloc":  # one enormous allocation: refused by the rlimit at once
        return len(bytearray(8 * 1024**3))
    if what == "infinite-loop":  # never returns: killed at the timeout
        while True:
            time.sleep(1)
    if what == "segfault":
        os.kill(os.getpid(), 11)
    if what == "garbage":
        raise Permanent("not a supported upload format")
    return {"parsed": what}
