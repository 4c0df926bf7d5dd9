"""The forker (workers/forker.py) forks every worker; the supervisor never does. A forker that
dies takes its workers with it (PR_SET_PDEATHSIG), and that is nobody's job's fault: their jobs
are released with the delivery given back, another forker is started, and the jobs run again."""

from __future__ import annotations

import json
import os
import signal

import psutil
import pytest

from stress import bench_slots
from supervisor.model import JobState
from tests.integration.fleet import Harness, alive, handlers, wait_gone
from tests.support.wait import eventually

pytestmark = pytest.mark.parametrize("engine", ["sqlite"])  # the store plays no part here


def test_workers_are_the_forkers_children_and_the_supervisor_forks_none(fleet: Harness) -> None:
    fleet.configure({"p": {"handlers": handlers("echo"), "min_workers": 2, "max_workers": 2}})
    sup = fleet.start()
    sup.wait_workers(fleet.store, "p", 2)
    (forker,) = sup.forker_pids()
    workers = sup.worker_processes()
    assert len(workers) == 2 and all(w.ppid() == forker for w in workers)
    (job,) = fleet.wait_final([fleet.enqueue("echo", {"n": 1})], watch=[sup])
    assert job.state == JobState.DONE
    assert sup.forks() == 2  # by the forker; the supervisor's own log holds no worker fork


def test_a_forker_that_dies_costs_no_job_a_delivery(fleet: Harness) -> None:
    fleet.configure(
        {
            "p": {
                "handlers": handlers("sleep"),
                "min_workers": 2,
                "max_workers": 2,
                "max_deliveries": 1,  # a delivery charged for the forker's death: dead
            }
        }
    )
    sup = fleet.start()
    ids = [fleet.enqueue("sleep", {"seconds": 1.5}) for _ in range(2)]
    sup.wait_workers(fleet.store, "p", 2, "busy")
    workers = sup.worker_processes()
    (forker,) = sup.forker_pids()
    os.kill(forker, signal.SIGKILL)
    wait_gone(workers, timeout=2.0)  # they die with it
    new = eventually(lambda: sup.forker_pids() - {forker}, timeout=10)
    assert len(new) == 1
    jobs = fleet.wait_final(ids, timeout=20, watch=[sup])
    for job in jobs:
        assert job.state == JobState.DONE, job
        assert job.attempts == 1, job  # the interrupted delivery was given back
    sup.check_alive()
    assert "the forker stopped" in sup.log()
    assert all(w.ppid() in new for w in sup.worker_processes())
    assert not [p for p in psutil.process_iter() if p.pid == forker and p.is_running()]


def test_a_worker_hands_no_descriptor_of_its_own_to_what_its_job_execs(fleet: Harness) -> None:
    # the worker's socket, its cancel page and its cgroup.procs come over SCM_RIGHTS: a
    # program its job started (os.system, a Popen with close_fds=False) must not keep them
    fleet.configure(
        {
            "p": {
                "handlers": handlers("inheritable_fds"),
                "min_workers": 1,
                "max_workers": 1,
                "memory_limit": "256MiB",  # a memory cgroup too, where the host has them
            }
        }
    )
    sup = fleet.start()
    (job,) = fleet.wait_final([fleet.enqueue("inheritable_fds")], watch=[sup])
    assert job.state == JobState.DONE, job
    assert job.result == {}, job.result


def test_a_ctrl_c_at_its_terminal_drains_the_fleet_and_kills_no_forker(fleet: Harness) -> None:
    # a terminal's Ctrl-C is a SIGINT to the whole foreground process group: the supervisor,
    # its forker and its store processes (the workers each have a group of their own)
    fleet.configure(
        {"p": {"handlers": handlers("sleep"), "min_workers": 1, "max_workers": 1}},
        grace_period="10s",
    )
    sup = fleet.start()
    job = fleet.enqueue("sleep", {"seconds": 3})
    sup.wait_workers(fleet.store, "p", 1, "busy")
    (forker,) = sup.forker_pids()
    os.killpg(sup.pid, signal.SIGINT)
    assert sup.wait_exit(timeout=20) == 0, sup.log()
    assert fleet.job(job).state == JobState.DONE
    assert "the forker stopped" not in sup.log()
    assert sup.forks() == 1  # the forker lived through it: no second one
    assert not psutil.pid_exists(forker) or not alive(psutil.Process(forker))


def test_the_benchmarks_find_a_supervisors_workers_under_its_forker(fleet: Harness) -> None:
    fleet.configure({"bench": {"handlers": handlers("echo"), "min_workers": 2, "max_workers": 2}})
    sup = fleet.start()
    sup.wait_workers(fleet.store, "bench", 2)
    idle = bench_slots._wait_idle(psutil.Process(sup.pid), 2, timeout=10)
    assert sorted(idle) == sorted(p.pid for p in sup.worker_processes())


FORKER_HANDLERS = "tests.support.forker_handlers:"


def test_the_forker_is_a_fresh_interpreter_and_workers_hold_no_supervisor_code(
    fleet: Harness,
) -> None:
    fleet.configure({"p": {"handlers": {"modules": FORKER_HANDLERS + "modules"}}})
    sup = fleet.start()
    sup.wait_workers(fleet.store, "p", 1)
    (forker,) = sup.forker_pids()

    # spawned, not a fork of the supervisor: none of its libraries mapped
    def maps_sqlalchemy(pid: int) -> bool:
        return any("sqlalchemy" in m.path for m in psutil.Process(pid).memory_maps())

    assert maps_sqlalchemy(sup.pid) and not maps_sqlalchemy(forker)
    (job,) = fleet.wait_final([fleet.enqueue("modules")], watch=[sup])
    assert job.state == JobState.DONE, job
    assert job.result == {"supervisor": [], "heavy": []}, job.result
    # the supervisor holds them all; the forker and so every worker copies none of it
    assert psutil.Process(forker).memory_info().rss < psutil.Process(sup.pid).memory_info().rss


def test_handlers_the_forker_cannot_import_stop_the_start_in_one_line(
    fleet: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETD_TEST_FORKER_IMPORT_FAILS", "1")
    fleet.configure({"p": {"handlers": {"modules": FORKER_HANDLERS + "modules"}}})
    sup = fleet.start(wait=False)
    assert sup.wait_exit(20) == 2
    lines = [line for line in sup.log().splitlines() if "could not import" in line]
    assert len(lines) == 1, sup.log()
    assert "refuses to load outside the supervisor" in lines[0]
    assert sup.forks() == 0


def test_a_forker_started_again_may_take_its_time_to_import(
    fleet: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 3 s of imports: longer than a fork request may take (forklink.REPLY_LIMIT); the fleet
    # asks the new forker for workers only once it says it is ready
    monkeypatch.setenv("FLEETD_TEST_SLOW_IMPORT", "3")
    fleet.configure(
        {"p": {"handlers": {"modules": FORKER_HANDLERS + "modules"}, "max_deliveries": 1}}
    )
    sup = fleet.start()
    sup.wait_workers(fleet.store, "p", 1)
    (forker,) = sup.forker_pids()
    os.kill(forker, signal.SIGKILL)
    eventually(lambda: sup.forker_pids() - {forker}, timeout=10)
    (job,) = fleet.wait_final([fleet.enqueue("modules")], timeout=30, watch=[sup])
    assert job.state == JobState.DONE, job
    log = sup.log()
    assert "forker started again" in log
    assert "did not answer" not in log and "did not import" not in log, log
    assert log.count("the forker stopped") == 1, log


def test_what_a_handler_logs_comes_out_in_the_fleets_log_format(fleet: Harness) -> None:
    # the forker is a fresh interpreter: it sets up the supervisor's format (the hello says
    # which), so a handler's lines are JSON objects like the supervisor's own
    fleet.configure(
        {"p": {"handlers": {"log_line": FORKER_HANDLERS + "log_line"}}}, log_format="json"
    )
    sup = fleet.start()
    (job,) = fleet.wait_final([fleet.enqueue("log_line", {"n": 41})], watch=[sup])
    assert job.state == JobState.DONE, job
    lines = [line for line in sup.log().splitlines() if "handler says 41" in line]
    assert len(lines) == 1, sup.log()
    record = json.loads(lines[0])
    assert record["logger"] == "app.render" and record["level"] == "WARNING", record


def test_workers_drop_the_signal_setup_handler_modules_left_in_the_forker(
    fleet: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the forker notes what its imports set up (warmup.prepare_forker) and keeps it; each
    # worker undoes it: a library's handler, a wake-up fd, the forker's blocked signals
    monkeypatch.setenv("FLEETD_TEST_FORKER_WAKEUP_FD", "1")
    fleet.configure({"p": {"handlers": {"state": FORKER_HANDLERS + "signal_state"}}})
    sup = fleet.start()
    (job,) = fleet.wait_final([fleet.enqueue("state")], watch=[sup])
    assert job.state == JobState.DONE, job
    state = job.result
    assert state["dispositions"] == {
        "SIGUSR1": "python",  # the soft timeout (protocol.SOFT_TIMEOUT_SIGNAL)
        "SIGUSR2": "SIG_DFL",  # the library's handler, dropped
        "SIGINT": "SIG_IGN",
        "SIGTERM": "SIG_IGN",
        "SIGCHLD": "SIG_DFL",
        "SIGALRM": "SIG_DFL",
    }, state
    assert state["cancel"] == "python", state
    assert state["blocked"] == [], state  # during the job: the soft timeout and the cancel reach it
    assert state["wakeup_fd"] == -1, state  # no byte of the worker's goes into the forker's pipe
    (forker,) = sup.forker_pids()
    caught = int(_status_field(forker, "SigCgt"), 16)
    assert caught & (1 << (signal.SIGUSR2 - 1)), (
        f"the forker lost the library's handler: {caught:x}"
    )


def test_a_forker_whose_imports_start_a_signal_timer_keeps_running(
    fleet: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a handler module that arms SIGALRM at import (a sampling profiler): its handler runs
    # in the forker, which lives on; its workers, which have no such timer, run their jobs
    monkeypatch.setenv("FLEETD_TEST_FORKER_ALARM", "1")
    fleet.configure({"p": {"handlers": {"sleep": FORKER_HANDLERS + "sleep"}}})
    sup = fleet.start()
    (forker,) = sup.forker_pids()
    (job,) = fleet.wait_final([fleet.enqueue("sleep", {"seconds": 0.5})], watch=[sup])
    assert job.state == JobState.DONE, job
    assert sup.forker_pids() == {forker}, sup.log()
    assert "the forker stopped" not in sup.log()


def test_a_forker_ignores_sigterm_whatever_handler_its_imports_installed(
    fleet: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # systemd's SIGTERM reaches every process of the unit: the forker, which must live on
    # until the supervisor has drained, though a handler module installed a handler of its own
    monkeypatch.setenv("FLEETD_TEST_FORKER_SIGTERM", "1")
    fleet.configure({"p": {"handlers": {"sleep": FORKER_HANDLERS + "sleep"}}})
    sup = fleet.start()
    (forker,) = sup.forker_pids()
    job_id = fleet.enqueue("sleep", {"seconds": 2.0})
    sup.wait_workers(fleet.store, "p", 1, "busy")
    os.kill(forker, signal.SIGTERM)
    (job,) = fleet.wait_final([job_id], watch=[sup])
    assert job.state == JobState.DONE and job.attempts == 1, job
    assert "the forker stopped" not in sup.log(), sup.log()
    assert sup.forker_pids() == {forker}, sup.log()


def _status_field(pid: int, name: str) -> str:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(name + ":"):
                return line.split()[1]
    raise AssertionError(f"no {name} in /proc/{pid}/status")
