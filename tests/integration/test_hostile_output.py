"""What a handler returns or raises is input too: no job's output can stop the supervisor, and
one job's bad output costs that job alone.

Each hostile job ends done or dead with the right kind, the supervisor keeps running, and a
neighbour job of another pool with ``max_deliveries = 1`` that was running meanwhile ends done
(had the supervisor died with its lease, the reaper would have dead-lettered it as
``lease_expired``)."""

from __future__ import annotations

import pytest

from supervisor.model import ErrorKind, JobState
from tests.integration.fleet import Harness, handlers

pytestmark = pytest.mark.slow

POOLS = {
    "hostile": {
        "handlers": handlers("hostile"),
        "min_workers": 1,
        "max_workers": 1,
        "max_deliveries": 1,
    },
    "calm": {
        "handlers": handlers("sleep"),
        "min_workers": 1,
        "max_workers": 1,
        "max_deliveries": 1,
        "lease": "2s",
        "heartbeat": "500ms",
    },
}


def test_hostile_output_costs_its_own_job_alone(fleet: Harness) -> None:
    fleet.configure(POOLS)
    sup = fleet.start()
    neighbour = fleet.enqueue("sleep", {"seconds": 3})
    expected = {
        "raise_nul": (JobState.DEAD, ErrorKind.EXCEPTION, "ValueError: bad\\0byte"),
        "raise_surrogate": (JobState.DEAD, ErrorKind.EXCEPTION, "lone ? surrogate"),
        "raise_huge": (JobState.DEAD, ErrorKind.EXCEPTION, "ValueError: xxxx"),
        "raise_unprintable": (JobState.DEAD, ErrorKind.EXCEPTION, "_UnprintableError"),
        "return_nul": (JobState.DONE, None, None),
        "return_surrogate": (JobState.DONE, None, None),
    }
    ids = {how: fleet.enqueue("hostile", {"how": how}) for how in expected}
    jobs = dict(
        zip(ids, fleet.wait_final(list(ids.values()), timeout=30, watch=[sup]), strict=True)
    )

    for how, (state, kind, said) in expected.items():
        job = jobs[how]
        assert job.state == state, (how, job)
        assert job.error_kind == kind, (how, job)
        if said is not None:
            assert job.last_error is not None and said in job.last_error, (how, job.last_error)
            assert len(job.last_error) <= 4100, (how, len(job.last_error))
    assert jobs["raise_unprintable"].last_error == "_UnprintableError"
    assert jobs["return_nul"].result == {"text": "a\x00b", "k\x00ey": ["\x00"]}
    assert jobs["return_surrogate"].result == {"text": "lone \ud800 surrogate"}
    assert "more characters cut" not in (jobs["raise_huge"].last_error or "")  # the worker cut it

    (calm,) = fleet.wait_final([neighbour], timeout=20, watch=[sup])
    assert calm.state == JobState.DONE and calm.attempts == 1, calm
    sup.check_alive()
    assert "Traceback" not in sup.log()


def refuse_results_containing(store, marker: str) -> None:
    """A trigger of the test's own: the database refuses a job row whose result holds
    ``marker`` (a value a driver would accept but a constraint refuses)."""
    with store.engine.begin() as conn:
        if store.dialect == "sqlite":
            conn.exec_driver_sql(
                "CREATE TRIGGER refuse_marker BEFORE UPDATE OF result ON fleetd_jobs "
                f"WHEN instr(NEW.result, '{marker}') > 0 "
                "BEGIN SELECT RAISE(ABORT, 'refused by the test''s trigger'); END"
            )
        else:
            conn.exec_driver_sql(
                "CREATE FUNCTION refuse_marker() RETURNS trigger AS $$ BEGIN "
                f"IF strpos(NEW.result, '{marker}') > 0 THEN RAISE EXCEPTION 'refused by the "
                "test''s trigger' USING ERRCODE = 'check_violation'; END IF; "
                "RETURN NEW; END $$ LANGUAGE plpgsql"
            )
            conn.exec_driver_sql(
                "CREATE TRIGGER refuse_marker BEFORE UPDATE ON fleetd_jobs "
                "FOR EACH ROW EXECUTE FUNCTION refuse_marker()"
            )


def test_a_result_read_with_a_bad_frame_behind_it_is_kept(fleet: Harness) -> None:
    """One read from the worker brings the job's JobDone and then a frame that is not JSON:
    the supervisor takes the result, then treats the stream as broken (the worker exits 3).
    The job ends done with that result, not crashed by the exit."""
    fleet.configure(
        {
            "p": {
                "handlers": handlers("result_then_garbage", "echo"),
                "min_workers": 1,
                "max_workers": 1,
                "max_deliveries": 1,
            }
        }
    )
    sup = fleet.start()
    job_id = fleet.enqueue("result_then_garbage")
    (job,) = fleet.wait_final([job_id], timeout=20, watch=[sup])
    assert job.state == JobState.DONE and job.error_kind is None, job
    assert job.result == {"written": "by the handler"} and job.attempts == 1, job
    assert "broken frame" in sup.log()
    (after,) = fleet.wait_final([fleet.enqueue("echo", {"n": 1})], timeout=20, watch=[sup])
    assert after.state == JobState.DONE, after  # a new worker took over
    sup.check_alive()


def test_a_result_the_database_refuses_fails_that_job_alone(fleet: Harness) -> None:
    fleet.configure({"p": {"handlers": handlers("echo"), "min_workers": 2, "max_workers": 2}})
    refuse_results_containing(fleet.store, "poison")
    sup = fleet.start()
    ids = [fleet.enqueue("echo", {"n": n, **({"poison": 1} if n == 7 else {})}) for n in range(30)]
    jobs = fleet.wait_final(ids, timeout=30, watch=[sup])

    bad = jobs[7]
    assert bad.state == JobState.DEAD and bad.error_kind == ErrorKind.PERMANENT, bad
    assert "its result could not be stored" in (bad.last_error or ""), bad.last_error
    assert "refused by the test's trigger" in (bad.last_error or ""), bad.last_error
    others = jobs[:7] + jobs[8:]
    assert all(j.state == JobState.DONE and j.attempts == 1 for j in others), others
    sup.check_alive()


def test_an_unexpected_error_in_the_loop_releases_every_lease(fleet: Harness) -> None:
    """The error policy, through a test seam: once this node holds two running jobs the loop
    raises. The supervisor stops its workers, releases both jobs with their attempts given
    back, and exits non-zero; a second supervisor then runs them."""
    fleet.configure(
        {
            "p": {
                "handlers": handlers("sleep"),
                "min_workers": 2,
                "max_workers": 2,
                "max_deliveries": 1,
                "lease": "30s",
            }
        }
    )
    sup = fleet.start(hooks=["--loop-fault", "2"])
    ids = [fleet.enqueue("sleep", {"seconds": 30}) for _ in range(2)]
    assert sup.wait_exit(timeout=20) == 70
    assert "injected loop fault" in sup.log() and "Traceback" in sup.log()
    assert not sup.alive_descendants()
    for job in fleet.jobs(ids):
        # released, not left leased for 30 s: queued, the delivery given back
        assert job.state == JobState.QUEUED and job.attempts == 0, job
    second = fleet.start("node-b")
    fleet.wait_state(ids, JobState.LEASED, timeout=10)
    second.check_alive()
