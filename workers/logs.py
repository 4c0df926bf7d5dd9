"""The log format the supervisor and its workers share: human lines by default, one JSON
object a line with ``log_format = "json"``, on stderr. Here, not in supervisor/observe/logs.py,
because the forker is a fresh interpreter that imports only this package: it sets up the same
format (the hello names it) so what a handler logs comes out as the supervisor's lines do.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

JOB_FIELDS = (
    "event",
    "job_id",
    "pool",
    "kind",
    "attempt",
    "max_deliveries",
    "duration",
    "peak_rss",
    "error_kind",
    "node",
)
HUMAN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ts (UTC, ISO 8601), level, logger, msg, the job fields when
    present, and the traceback as ``exc``."""

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.fromtimestamp(record.created, UTC)
        out: dict[str, Any] = {
            "ts": ts.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in JOB_FIELDS:
            value = getattr(record, key, None)
            if value is not None:
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


# whether this process logs JSON lines (set by ``setup_logging``; a fork inherits it)
json_lines = False


def json_line(level: str, logger: str, message: str, exc: str | None = None) -> str:
    """One line as ``JsonFormatter`` writes it (a traceback as ``exc``), for what is written
    without the logging module (a worker's last words before ``os._exit``)."""
    ts = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    out = {"ts": ts, "level": level, "logger": logger, "msg": message}
    if exc is not None:
        out["exc"] = exc
    return json.dumps(out)


def setup_logging(fmt: str = "human", stream: Any = None, level: int = logging.INFO) -> None:
    """Configure the root logger once, for ``fleetd start``."""
    global json_lines
    json_lines = fmt == "json"
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(HUMAN_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
