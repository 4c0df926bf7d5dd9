"""Typed errors, one root. Each boundary translates foreign errors into these exactly once.

The CLI turns any ``FleetdError`` into a one-line message and exit status 2 (usage, config and
input errors) or 1 (the store being unreachable). The message itself says what and where.
"""

from __future__ import annotations


class FleetdError(Exception):
    """Root of every error fleetd raises on purpose."""

    exit_code = 2


class ConfigError(FleetdError):
    """fleet.toml is malformed or inconsistent. The message names file, key path, value and
    what was expected, in one line."""

    def __init__(self, path: str, key: str, message: str) -> None:
        self.path = path
        self.key = key
        where = f"{path}: {key}: " if key else f"{path}: "
        super().__init__(where + message)


class PayloadError(FleetdError):
    """A payload or result that is not a JSON object (refused before anything is written)."""


class UnknownKind(FleetdError):
    """A job kind that no pool of this config handles."""


class UnknownPool(FleetdError):
    """A pool name (a --pool filter) that neither this config nor any job in the database has."""


class JobNotFound(FleetdError):
    """No job with that id."""


class NotDead(FleetdError):
    """A dead-letter operation named a job that is not dead."""


class StoreError(FleetdError):
    """The store refused an operation (schema too new, bad URL...)."""


class StoreRejected(StoreError):
    """The database refused a write for what it holds (a value it cannot store, a constraint):
    the same write would be refused again, so it is not retried as it is. Callers that write
    many rows at once narrow it to the row that causes it (``Dispatcher.flush``)."""


class StoreUnavailable(StoreError):
    """The database could not be reached or failed mid-operation; the operation did not happen
    (each store verb is one transaction), so the caller may retry it."""

    exit_code = 1


class HandlerError(FleetdError):
    """A configured handler cannot be imported or is not callable."""
