from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.clock import FakeClock
from tests.support import alone
from tests.support.databases import database_url

# Every test here starts supervisors, forkers or workers, or waits on real time: the fast tier
# (`pytest -m "not slow"`) leaves them out without each file having to say so.
SLOW_FOLDERS = ("integration",)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(item.path).parent.name in SLOW_FOLDERS:
            item.add_marker(pytest.mark.slow)
        if is_alone(item):  # one worker runs them, one after the other (--dist loadgroup)
            item.add_marker(pytest.mark.xdist_group("alone"))


def is_alone(item: pytest.Item | None) -> bool:
    return item is not None and item.get_closest_marker("alone") is not None


_test_lock = alone.TestLock()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Under pytest-xdist, an ``alone`` test runs with no other test at once
    (tests/support/alone.py)."""
    _test_lock.before(is_alone(item))
    try:
        return (yield)
    finally:
        _test_lock.after(is_alone(nextitem))


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
