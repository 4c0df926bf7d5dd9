from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.clock import FakeClock
from tests.support.databases import database_url

ENGINES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    """Each test that uses it runs once per database engine."""
    return request.param


@pytest.fixture
def db_url(engine: str, tmp_path: Path) -> Iterator[str]:
    with database_url(engine, tmp_path) as url:
        yield url


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(db_url: str, clock: FakeClock):
    from supervisor.store import open_store

    s = open_store(db_url, clock)
    yield s
    s.close()
