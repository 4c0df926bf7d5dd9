"""fleet.toml -> frozen, typed ``FleetConfig`` and ``PoolConfig``: ``load_config`` and
``parse_config``, and every failure turned into one line.

Why pydantic: one declarative schema (the field declarations in config.fleet, config.pool and
config.schedule) yields the validation, the defaults and the documented example
(``example_toml()`` renders conf/fleet.example.toml from the field descriptions), and
``extra="forbid"`` rejects unknown keys instead of ignoring a typo. Pydantic stays behind these
modules: its ValidationError is translated here, once, into a one-line ``ConfigError``::

    <file>: <key path>: <the bad value's repr and what was wrong> (expected <what>)

Values go through ``supervisor.units`` (config.values), so "250ms", "512MiB" and "80%" mean the
same here as on the command line. Everything is checked at load; nothing is read from the
environment at import. The models are frozen; their mappings are plain dicts that nobody may
mutate.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from supervisor.config.example import example_toml
from supervisor.config.fleet import FleetConfig
from supervisor.config.keys import key_path, keys_of, unknown_key
from supervisor.config.pool import PoolConfig
from supervisor.config.schedule import ScheduleConfig
from supervisor.errors import ConfigError

# example_toml is re-exported: the generated example names it here, as its regeneration does
__all__ = ["example_toml", "load_config", "parse_config"]


def load_config(path: str | Path, environ: Mapping[str, str] | None = None) -> FleetConfig:
    """Read and validate a fleet.toml. ``environ`` (default ``os.environ``) supplies ``${VAR}``
    in the database URL. Any problem raises a one-line ConfigError naming file and key."""
    label = str(path)
    try:
        with open(path, "rb") as file:
            data = tomllib.load(file)
    except FileNotFoundError:
        raise ConfigError(label, "", "no such file (expected the path of a fleet.toml)") from None
    except OSError as exc:
        raise ConfigError(label, "", f"cannot be read: {exc.strerror} (expected a file)") from None
    except UnicodeDecodeError:
        raise ConfigError(label, "", "is not UTF-8 text (expected a TOML file)") from None
    except tomllib.TOMLDecodeError as exc:
        raise _toml_error(label, exc) from None
    return _build(data, Path(path), label, environ)


def parse_config(
    text: str, path: str | Path, environ: Mapping[str, str] | None = None
) -> FleetConfig:
    """As load_config, from TOML text; ``path`` names the file for relative paths and errors."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _toml_error(str(path), exc) from None
    return _build(data, Path(path), str(path), environ)


def _toml_error(label: str, exc: tomllib.TOMLDecodeError) -> ConfigError:
    # tomllib says e.g. "Invalid value (at line 3, column 10)"; keep it, moved to the front.
    text = str(exc)
    match = re.search(r"\s*\(at line (\d+), column (\d+)\)$", text)
    where = f"line {match[1]}, column {match[2]}" if match else ""
    what = text[: match.start()] if match else text.replace(" (at end of document)", "")
    return ConfigError(label, where, f"invalid TOML: {what[:1].lower()}{what[1:]}")


def _build(
    data: dict[str, Any], path: Path, label: str, environ: Mapping[str, str] | None
) -> FleetConfig:
    for key in data:
        if key not in ("fleet", "pools", "schedules"):
            known = ["fleet", "pools", "schedules"]
            raise ConfigError(label, key_path([key]), unknown_key(key, known))
    fleet = data.get("fleet", {})
    if not isinstance(fleet, dict):
        raise ConfigError(label, "fleet", f"{fleet!r} is not a table (expected a [fleet] table)")
    for key in fleet:
        if key not in keys_of(FleetConfig):
            raise ConfigError(
                label, key_path(["fleet", key]), unknown_key(key, keys_of(FleetConfig))
            )
    fields = {**fleet, "path": path, "pools": data.get("pools", {})}
    if "schedules" in data:
        fields["schedules"] = data["schedules"]
    try:
        return FleetConfig.model_validate(fields, context={"environ": environ})
    except ValidationError as exc:
        raise _translate(label, exc) from None


def _translate(label: str, exc: ValidationError) -> ConfigError:
    """The first of pydantic's errors as one ConfigError line; its loc becomes the key path as
    the user would write it (``pools.bulk.timeout``, ``fleet.database``)."""
    error = exc.errors(include_url=False)[0]
    loc: list[str | int] = list(error["loc"])
    tables = {"pools": PoolConfig, "schedules": ScheduleConfig}
    model: type[BaseModel] = tables.get(str(loc[0]) if loc else "", FleetConfig)
    if error["type"] == "value_error":
        problem = error["ctx"]["error"]
        loc += getattr(problem, "at", ())
        message = str(problem)
    elif error["type"] == "extra_forbidden":
        message = unknown_key(str(loc[-1]), keys_of(model))
    elif error["type"] == "missing":
        field = model.model_fields.get(str(loc[-1]))
        about = field.description if field is not None else "a value"
        message = f"missing (expected {about})"
    else:  # a shape our validators do not check first; pydantic's msg is short and URL-free
        message = f"{error['input']!r} is not valid: {error['msg']}"
    key = key_path(loc if str(loc[0] if loc else "") in tables else ["fleet", *loc])
    return ConfigError(label, key, " ".join(message.split()))
