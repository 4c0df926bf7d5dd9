"""Real databases for tests: a SQLite file under tmp_path, or a PostgreSQL schema of its own.

PostgreSQL tests use ``FLEETD_TEST_POSTGRES_URL``. Without it they are skipped with the reason
printed, except under CI (``CI`` set), where a missing database is a failure, not a skip.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import pytest

POSTGRES_ENV = "FLEETD_TEST_POSTGRES_URL"


def postgres_base_url() -> str:
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        reason = f"PostgreSQL tests need {POSTGRES_ENV} (e.g. postgresql://postgres@127.0.0.1/test)"
        if os.environ.get("CI"):
            pytest.fail(reason + "; CI must run them")
        pytest.skip(reason)
    return url


@contextmanager
def postgres_schema_url() -> Iterator[str]:
    """A URL whose connections live in a fresh schema, dropped afterwards."""
    import psycopg

    base = postgres_base_url()
    schema = "t_" + uuid.uuid4().hex[:12]
    plain = base.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(plain, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in base else "?"
    try:
        yield f"{base}{sep}options={quote(f'-csearch_path={schema}')}"
    finally:
        with psycopg.connect(plain, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


@contextmanager
def database_url(engine: str, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database of ``engine`` ("sqlite" or "postgres")."""
    if engine == "sqlite":
        yield f"sqlite:///{tmp_path / 'fleetd.db'}"
    else:
        with postgres_schema_url() as url:
            yield url
