"""Turn ``"module:function"`` specs into callables, in the parent, before any fork; a
``CommandSpec`` (a kind that runs a program) becomes a ``workers.command.CommandHandler``.

Importing before the fork means an unimportable handler stops ``fleetd start`` with one clear
line instead of a pool of workers dying at boot, and the imported modules' pages are shared
copy-on-write by every worker. A job row never names code: only the kinds of the node's own
``fleet.toml`` are ever loaded.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any, cast

from workers.command import CommandHandler
from workers.command_rules import CommandSpec
from workers.errors import HandlerImportError, one_line

Handler = Callable[[Any], Any]


def resolve(spec: str) -> Handler:
    """Import ``"package.module:attr"`` (``attr`` may be dotted, as ``Class.method``).

    Raises ``HandlerImportError`` naming the spec and the cause: a malformed spec, a module
    that does not exist, an import that raised, a missing attribute, or a non-callable.
    Importing runs the module's top-level code; a module that hangs at import hangs here.
    """
    module_name, sep, attr_path = spec.partition(":")
    if not sep or not module_name or not attr_path:
        raise HandlerImportError(spec, "expected 'module:function'")
    obj: object = _import(spec, module_name)
    for i, attr in enumerate(attr_path.split(".")):
        try:
            obj = getattr(obj, attr)
        except AttributeError:
            owner = ".".join([module_name, *attr_path.split(".")[:i]])
            raise HandlerImportError(spec, f"{owner!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise HandlerImportError(spec, f"{attr_path!r} is a {type(obj).__name__}, not callable")
    return cast(Handler, obj)


def _import(spec: str, module_name: str) -> object:
    """Import a module, telling "does not exist" apart from "raised while importing"."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # exc.name is the module that was missing: ours (or a parent package of it) means the
        # spec is wrong; any other name is a dependency missing inside the handler's module.
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise HandlerImportError(spec, f"module {module_name!r} not found") from None
        raise HandlerImportError(spec, f"import raised {one_line(exc)}") from exc
    except (Exception, SystemExit) as exc:
        raise HandlerImportError(spec, f"import raised {one_line(exc)}") from exc


def load_handlers(mapping: Mapping[str, str | CommandSpec]) -> dict[str, Handler]:
    """Resolve every kind's spec; the first failure raises ``HandlerImportError`` naming it.
    A command is not looked up here: a program missing on PATH fails its jobs (``fleetd
    check`` says which are missing), it does not stop the start."""
    out: dict[str, Handler] = {}
    for kind, spec in mapping.items():
        if isinstance(spec, CommandSpec):
            out[kind] = CommandHandler(spec)
            continue
        try:
            out[kind] = resolve(spec)
        except HandlerImportError as exc:
            raise exc.with_kind(kind) from exc.__cause__
    return out
