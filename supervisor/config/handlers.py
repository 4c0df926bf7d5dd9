"""A pool's handlers table: job kind -> ``"module:function"`` or a command table.

Only the form is checked here: importing a handler is workers.handlers' job, before the fork. A
command table becomes a ``workers.command.CommandSpec``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BeforeValidator

from supervisor.config.keys import unknown_key
from supervisor.config.values import Problem, check_duration, optional
from workers.command_rules import CommandSpec, placeholder_names


def check_handler(value: Any) -> str | CommandSpec:
    """A ``"module:function"`` reference (its form only), or a table: a command handler
    (``command_spec``)."""
    if isinstance(value, CommandSpec):
        return value
    if isinstance(value, Mapping):
        return command_spec(value)
    module, _, function = value.partition(":") if isinstance(value, str) else ("", "", "")
    parts = [*module.split("."), function]
    if not all(part.isidentifier() for part in parts):
        expected = 'a "module:function" reference such as "app.jobs:reindex", or a table'
        expected += ' such as { command = ["pdftotext", "{path}", "-"] }'
        raise ValueError(f"{value!r} is not a handler (expected {expected})")
    return value


COMMAND_KEYS = ["command", "stall_timeout", "permanent_codes", "env"]


def command_spec(table: Mapping[str, Any]) -> CommandSpec:
    """``{ command = [argv...], stall_timeout = "30s", permanent_codes = [2, 65],
    env = { NAME = "value" } }``."""
    for key in table:
        if key not in COMMAND_KEYS:
            raise Problem(unknown_key(str(key), COMMAND_KEYS), (key,))
    if "command" not in table:
        raise ValueError('a command handler without command (expected command = ["prog", ...])')
    argv = table["command"]
    if not isinstance(argv, list) or not argv:
        expected = 'a non-empty list of strings, e.g. ["pdftotext", "{path}", "-"]'
        raise Problem(f"{argv!r} is not a command (expected {expected})", ("command",))
    for i, arg in enumerate(argv):
        if not isinstance(arg, str) or "\0" in arg or (i == 0 and not arg.strip()):
            what = "a program name" if i == 0 else "a string argument"
            raise Problem(f"{arg!r} is not {what} (expected {what})", ("command", i))
    if placeholder_names(argv[0]):
        raise Problem(
            f"{argv[0]!r} names the program from the payload (expected a fixed program)",
            ("command", 0),
        )
    stall = table.get("stall_timeout")
    try:
        stall = optional(check_duration)(stall)
    except ValueError as exc:
        raise Problem(str(exc), ("stall_timeout",)) from None
    codes = table.get("permanent_codes", [])
    if not isinstance(codes, list):
        raise Problem(f"{codes!r} is not a list (expected e.g. [2, 65])", ("permanent_codes",))
    for i, code in enumerate(codes):
        if isinstance(code, bool) or not isinstance(code, int) or not 1 <= code <= 255:
            message = f"{code!r} is not an exit code (expected an integer from 1 to 255)"
            raise Problem(message, ("permanent_codes", i))
    env = table.get("env", {})
    if not isinstance(env, Mapping):
        raise Problem(f'{env!r} is not a table (expected e.g. {{ LANG = "C.UTF-8" }})', ("env",))
    for name, value in env.items():
        if not ENV_NAME.fullmatch(name):
            message = f"{name!r} is not a variable name (expected letters, digits and _)"
            raise Problem(message, ("env", name))
        if not isinstance(value, str) or "\0" in value:
            raise Problem(f"{value!r} is not a string (expected a string)", ("env", name))
    return CommandSpec(tuple(argv), stall, frozenset(codes), tuple(sorted(env.items())))


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_kind_table(value: Any) -> Any:
    """A table keyed by job kind (handlers, kind_max_inflight, kind_rate_limit)."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{value!r} is not a table (expected {{ kind = ... }})")
    for kind in value:
        if not kind or any(c.isspace() or not c.isprintable() for c in kind):
            raise Problem(f"{kind!r} is not a job kind (expected a name without spaces)", (kind,))
    return value


def check_handler_table(value: Any) -> Any:
    """The handlers table: a kind table with at least one kind."""
    if check_kind_table(value) == {}:
        raise ValueError('no handlers (expected { kind = "module:function", ... })')
    return value


Handlers = Annotated[
    dict[str, Annotated[str | CommandSpec, BeforeValidator(check_handler)]],
    BeforeValidator(check_handler_table),
]
