"""What a config key is: declared once with its documentation, listed per table, written as a
key path, and named in the error for an unknown one.

A key is a pydantic field: ``key`` gives it the one-line description and example that
example_toml() prints; ``shape`` marks a field filled from the file's shape (its path, the
``[pools.NAME]`` tables), which is not a key a user types.
"""

from __future__ import annotations

import difflib
import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
FROZEN = ConfigDict(extra="forbid", frozen=True)


def key(default: Any, about: str, *, example: Any = None, derived: str = "", **kw: Any) -> Any:
    """A documented key: ``about`` and ``example`` feed example_toml(); ``derived`` says what a
    computed default stands for (it is then shown commented out, with ``example``)."""
    examples = None if example is None else [example]
    extra = {"derived": derived} if derived else None
    return Field(default, description=about, examples=examples, json_schema_extra=extra, **kw)


def shape(**kw: Any) -> Any:
    """A field filled from the file's shape (its path, the [pools.NAME] tables), not a key."""
    return Field(json_schema_extra={"shape": True}, **kw)


def key_path(parts: list[str | int]) -> str:
    """``["pools", "bulk", "handlers", "pdf.render"]`` -> ``pools.bulk.handlers."pdf.render"``."""
    path = ""
    for part in parts:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            segment = part if _BARE_KEY.fullmatch(part) else json.dumps(part)
            path += f".{segment}" if path else segment
    return path


def keys_of(model: type[BaseModel]) -> list[str]:
    """The keys a user may type for ``model``, in schema order."""
    return [
        name for name, field in model.model_fields.items() if not field_meta(field).get("shape")
    ]


def unknown_key(key: str, known: list[str]) -> str:
    """The error text for a key not in ``known``, with the likely one it was meant to be."""
    # difflib catches typos ("memry_limit"); the substring test catches a short form ("grace").
    close = difflib.get_close_matches(key, known, n=1) or [k for k in known if key in k][:1]
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown key ({hint}known: {', '.join(known)})"


def field_meta(field: Any) -> dict[str, Any]:
    """What ``key`` and ``shape`` noted on a field (derived, shape)."""
    extra = field.json_schema_extra
    return extra if isinstance(extra, dict) else {}
