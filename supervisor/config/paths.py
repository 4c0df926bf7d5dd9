"""Where a fleet.toml's values point: relative paths resolve against the file's folder, ``${VAR}``
reads the environment given to the loader, and the database URL comes out fully resolved.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationInfo

from supervisor.config.values import Problem

_ENV_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_URL = re.compile(r"(?P<dialect>sqlite|postgresql)(?:\+[A-Za-z0-9_]+)?://(?P<rest>.*)", re.DOTALL)


def environ_of(info: ValidationInfo) -> Mapping[str, str]:
    """The environment the loader was given (``os.environ`` by default), for ``${VAR}``."""
    environ = (info.context or {}).get("environ")
    return os.environ if environ is None else environ


def folder_of(info: ValidationInfo) -> Path:
    """Relative paths in the file resolve against the file's folder, not the working directory:
    systemd and Kubernetes start fleetd from wherever they like."""
    path = info.data.get("path")
    return path.parent if path is not None else Path(os.path.abspath("."))


def _under(folder: Path, path: str | Path) -> Path:
    # abspath, not resolve(): it normalises ".." without following symlinks, so a deploy's
    # "current -> releases/42" stays as the operator wrote it.
    return Path(os.path.abspath(folder / path))


def _expand(raw: str, environ: Mapping[str, str]) -> str:
    def lookup(match: re.Match[str]) -> str:
        name = match[1]
        if name not in environ:
            message = f"{raw!r} uses the environment variable {name}, which is not set"
            raise ValueError(f"{message} (expected {name} in the environment)")
        return environ[name]

    return _ENV_VAR.sub(lookup, raw)


def resolve_database_url(raw: Any, folder: Path, environ: Mapping[str, str]) -> str:
    """Expand ``${VAR}``, check the dialect, make a relative SQLite path absolute. Messages show
    the value as typed, never the expanded one: it may carry a password."""
    expected = 'a SQLAlchemy URL such as "sqlite:///fleetd.db" or "postgresql://host/db"'
    if not isinstance(raw, str):
        raise ValueError(f"{raw!r} is not a database URL (expected {expected})")
    url = _expand(raw, environ)
    match = _URL.fullmatch(url)
    if match is None:
        expanded = " once expanded" if url != raw else ""
        raise ValueError(f"{raw!r} is not a database URL{expanded} (expected {expected})")
    if match["dialect"] != "sqlite":
        return url
    return _sqlite_url(raw, url[: url.index("://")], match["rest"], folder)


def _sqlite_url(raw: str, scheme: str, rest: str, folder: Path) -> str:
    # "sqlite:///x.db" leaves rest "/x.db" (relative); "sqlite:////abs/x.db" leaves "//abs/x.db".
    file, query = rest[1:].partition("?")[::2] if rest.startswith("/") else ("", "")
    if file in ("", ":memory:") or "mode=memory" in query:
        expected = 'a file, e.g. "sqlite:///fleetd.db": every fleetd process must share it'
        raise ValueError(f"{raw!r} is not a database file (expected {expected})")
    if not file.startswith("file:"):  # URI filenames are passed through as written
        file = str(_under(folder, file))
    return f"{scheme}:///{file}" + (f"?{query}" if query else "")


def resolve_python_path(value: Any, folder: Path) -> tuple[Path, ...]:
    """``python_path``'s folders, absolute (relative ones against the file's folder)."""
    if not isinstance(value, list | tuple):
        raise ValueError(f'{value!r} is not a list of folders (expected e.g. [".", "src"])')
    for index, entry in enumerate(value):
        if not isinstance(entry, str | Path) or not str(entry):
            raise Problem(f"{entry!r} is not a folder (expected a path string)", (index,))
    return tuple(_under(folder, entry) for entry in value)
