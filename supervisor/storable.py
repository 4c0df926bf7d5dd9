"""What a handler produced, made storable before it reaches a database driver. Pure.

A worker runs untrusted code, so what it sends back is input like any other: an exception
message may hold NUL bytes (PostgreSQL's text type refuses them), lone surrogates (no driver
can encode them as UTF-8) or megabytes of text. The parent passes every message and result
through here once, when the frame arrives, so a write never fails on a value and one job's
output can never stop the writes of the others.

- ``storable_message``: NUL becomes the two characters ``\\0``, a lone surrogate becomes
  U+FFFD, and text over the cap is cut with a note saying how much was cut.
- ``storable_result``: result JSON text is kept as it is when it is plain ASCII without NUL
  (what the worker's ``json.dumps`` makes); otherwise it is parsed and written again with
  escapes (``\\u0000`` is JSON, not a NUL byte); text that is not JSON then is refused,
  and the caller fails that job, alone. (ASCII text is not parsed: that costs a no-op job
  more than its run, and the database stores it as it is whatever it holds.)
"""

from __future__ import annotations

import json
import re

MAX_MESSAGE = 4000  # characters of an error message kept (the worker cuts at the same length)
_CUT_NOTE = " [... {n} more characters cut]"
_SURROGATE = re.compile("[\ud800-\udfff]")


def storable_message(text: str, limit: int = MAX_MESSAGE) -> str:
    """``text`` without NUL bytes or lone surrogates, at most ``limit`` characters plus a note
    saying how many were cut.

    >>> storable_message("bad\\x00byte")
    'bad\\\\0byte'
    >>> storable_message("lone \\udc80 surrogate")
    'lone \\ufffd surrogate'
    >>> storable_message("x" * 12, limit=5)
    'xxxxx [... 7 more characters cut]'
    """
    if len(text) > limit:
        text = text[:limit] + _CUT_NOTE.format(n=len(text) - limit)
    if "\x00" in text:
        text = text.replace("\x00", "\\0")
    if not text.isascii():
        text = _SURROGATE.sub("\ufffd", text)  # a surrogate code point cannot be encoded
    return text


class UnstorableResult(ValueError):
    """A result frame whose text is not JSON (a worker that wrote its own frames)."""


def storable_result(text: str) -> str:
    """JSON text any driver stores as it is: ASCII with every control character escaped.

    >>> storable_result('{"a": 1}')
    '{"a": 1}'
    >>> storable_result('{"t": "a\\x00b"}')
    '{"t": "a\\\\u0000b"}'
    """
    if text.isascii() and "\x00" not in text:
        return text
    try:
        return json.dumps(json.loads(text, strict=False), ensure_ascii=True, allow_nan=False)
    except (ValueError, RecursionError) as exc:
        raise UnstorableResult(f"result is not valid JSON: {storable_message(str(exc))}") from exc
