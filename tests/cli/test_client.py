"""The Python API against a real database, on both engines."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor import Client
from supervisor.errors import JobNotFound, PayloadError, UnknownKind
from supervisor.model import Ack, JobState


def write_config(tmp_path: Path, db_url: str, extra: str = "") -> Path:
    path = tmp_path / "fleet.toml"
    path.write_text(
        f"""
[fleet]
database = "{db_url}"

[pools.bulk]
handlers = {{ render = "app:render", index = "app:index" }}
max_deliveries = 4
{extra}

[pools.fast]
handlers = {{ ping = "app:ping" }}
"""
    )
    return path


@pytest.fixture
def client(tmp_path: Path, db_url: str):
    with Client.from_config(write_config(tmp_path, db_url)) as c:
        yield c


def test_enqueue_routes_the_kind_to_its_pool(client):
    jid = client.enqueue("render", {"doc": 42}, tenant="acme", key="doc-42", priority=3)
    job = client.get(jid)
    assert (job.pool, job.max_deliveries, job.tenant, job.key, job.priority) == (
        "bulk",
        4,
        "acme",
        "doc-42",
        3,
    )
    assert job.payload == {"doc": 42} and job.state is JobState.QUEUED
    assert client.enqueue("render", {"doc": 0}, key="doc-42") == jid
    assert client.get(client.enqueue("ping")).pool == "fast"


def test_enqueue_many_accepts_tuples_and_dicts(client):
    ids = client.enqueue_many(
        [("render", {"doc": 1}), {"kind": "ping", "payload": {"x": 1}, "delay": "1m"}]
    )
    first, second = (client.get(i) for i in ids)
    assert first.kind == "render" and second.kind == "ping"
    assert second.available_at - second.enqueued_at == pytest.approx(60)


@pytest.mark.parametrize(
    ("call", "error", "text"),
    [
        (lambda c: c.enqueue("nope", {}), UnknownKind, "nope"),
        (lambda c: c.enqueue("render", [1, 2]), PayloadError, "JSON object"),
        (lambda c: c.enqueue("render", {"f": object()}), PayloadError, "JSON"),
        (lambda c: c.enqueue("render", {"f": float("nan")}), PayloadError, "JSON"),
        (lambda c: c.enqueue("render", {}, delay=-1), PayloadError, "delay"),
        (lambda c: c.enqueue("render", {}, delay="soon"), PayloadError, "delay"),
        (lambda c: c.enqueue("render", {}, priority="high"), PayloadError, "priority"),
        (lambda c: c.enqueue("render", {}, priority=2**31), PayloadError, "-2147483648 to 21"),
        (lambda c: c.enqueue("render", {}, priority=-(2**31) - 1), PayloadError, "priority"),
        (lambda c: c.enqueue_many([{"kind": "render", "priority": 2**63}]), PayloadError, "item 0"),
        (lambda c: c.enqueue("render", {}, tenant=""), PayloadError, "tenant"),
        (lambda c: c.enqueue_many([("render", {}), ("render", "x")]), PayloadError, "item 1"),
        (lambda c: c.enqueue_many([{"kind": "render", "colour": 1}]), PayloadError, "item 0"),
        (lambda c: c.get(424242), JobNotFound, "424242"),
    ],
)
def test_bad_input_raises_a_typed_error_and_writes_nothing(client, call, error, text):
    with pytest.raises(error, match=text) as err:
        call(client)
    assert "\n" not in str(err.value)
    assert client.store.list_jobs() == []


def test_wait_returns_when_done_and_times_out_otherwise(client):
    jid = client.enqueue("ping")
    with pytest.raises(TimeoutError, match=str(jid)):
        client.wait(jid, timeout=0.1)
    (claimed,) = client.store.claim(pool="fast", kinds={"ping"}, n=1, node="t", lease=30)
    client.store.ack([Ack(claimed.lease, '{"pong": 1}')])
    assert client.wait(jid, timeout=5).result == {"pong": 1}


def test_wait_all_returns_every_job_or_names_those_not_final(client):
    done, waiting = client.enqueue("ping"), client.enqueue("ping")
    (claimed,) = client.store.claim(pool="fast", kinds={"ping"}, n=1, node="t", lease=30)
    assert claimed.job_id == done
    client.store.ack([Ack(claimed.lease, '{"pong": 1}')])
    with pytest.raises(TimeoutError, match=rf"job {waiting} \(queued\)") as err:
        client.wait_all([done, waiting], timeout=0.1)
    assert str(done) not in str(err.value).split("job ", 1)[1]
    jobs = client.wait_all([waiting, done], timeout=0.1, partial=True)
    assert [(j.id, j.state) for j in jobs] == [
        (waiting, JobState.QUEUED),
        (done, JobState.DONE),
    ]
    assert client.cancel(waiting) is True
    assert [j.state for j in client.wait_all([done, waiting], timeout=5)] == [
        JobState.DONE,
        JobState.CANCELLED,
    ]


def test_wait_on_a_missing_job_says_so(client):
    with pytest.raises(JobNotFound, match="no job with id 4242"):
        client.wait(4242, timeout=1)


def test_wait_refuses_a_poll_that_would_spin(client):
    jid = client.enqueue("ping")
    with pytest.raises(ValueError, match="poll must be more than 0"):
        client.wait(jid, timeout=1, poll=0)
