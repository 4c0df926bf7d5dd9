"""The forker's protocol with real processes: every worker it forks is reported exited exactly
once, also when its exit is read together with the answer to another fork request."""

from __future__ import annotations

import doctest
import fcntl
import os
import resource
import select
import socket

import pytest

from supervisor.run.forklink import ForkFailed, start_forker
from supervisor.run.workerproc import WorkerHandle
from workers import forker, protocol
from workers.spec import WorkerSpec


def noop(payload: object) -> None:
    return None


def test_every_exit_is_relayed_once_while_forks_go_on() -> None:
    link = start_forker({"p": {"noop": noop}})
    spec = WorkerSpec(pool="p", slot=1, handlers={}, parent_pid=0)
    live: dict[int, object] = {}
    forked: list[int] = []
    exited: list[int] = []
    try:
        while len(forked) < 60 or live:
            while len(live) < 3 and len(forked) < 60:
                worker = link.fork_worker(spec, now=0.0)
                assert worker.pid not in forked
                forked.append(worker.pid)
                live[worker.pid] = worker
                # it exits right away: its exit races the next fork request's answer
                protocol.write_frame(worker.fd, protocol.Shutdown())
            if not link.exits:
                ready, _, _ = select.select([link.sock], [], [], 10.0)
                assert ready, f"no exit relayed for {sorted(live)}"
            for pid, status in link.take_exits():
                exited.append(pid)
                assert status == 0, (pid, status)
                live.pop(pid).sock.close()  # type: ignore[attr-defined]
                link.reaped(pid)
    finally:
        link.close(1.0)
    assert sorted(exited) == sorted(forked)


def test_the_forker_stops_with_its_link_and_leaves_no_worker() -> None:
    link = start_forker({"p": {"noop": noop}})
    worker = link.fork_worker(WorkerSpec(pool="p", slot=1, handlers={}, parent_pid=0), now=0.0)
    worker.sock.setblocking(True)
    assert isinstance(protocol.read_frame(worker.fd), protocol.Ready)
    forker = link.pid
    assert link.close(2.0) == 0  # it exited on its own: EOF, its worker killed and reaped
    assert worker.sock.recv(1) == b""  # the worker is gone: its end of the socket closed
    assert forker is not None


def test_doctests_pass() -> None:
    result = doctest.testmod(forker)
    assert result.attempted and not result.failed


def test_a_forker_on_a_descriptor_past_fd_setsize_still_answers() -> None:
    # a forker started again by a supervisor with hundreds of workers (a socket and a cancel
    # page each) gets a descriptor above 1023, which select() cannot wait on
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 1200), hard))
    filler = []
    try:
        while not filler or filler[-1] < 1100:
            filler.append(os.open(os.devnull, os.O_RDONLY))
        link = start_forker({"p": {"noop": noop}})
        try:
            assert (link.fileno() or 0) >= 1024
            spec = WorkerSpec(pool="p", slot=1, handlers={}, parent_pid=0)
            for _ in range(3):  # the first answer may come before the loop waits for it
                worker = link.fork_worker(spec, now=0.0)
                worker.sock.close()
        finally:
            link.close(1.0)
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_send_to_a_worker_on_a_descriptor_past_fd_setsize_waits_as_any_other() -> None:
    # a supervisor holds two descriptors a worker (its socket, its cancel page): its
    # five-hundredth worker's socket is past 1023, where select() cannot wait
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 1200), hard))
    ours, theirs = socket.socketpair()
    try:
        high = fcntl.fcntl(ours.fileno(), fcntl.F_DUPFD_CLOEXEC, 1100)
        sock = socket.socket(fileno=high)
        sock.setblocking(False)
        worker = WorkerHandle(pool="p", slot=1, pid=0, sock=sock, spawned_at=0.0)
        with pytest.raises(TimeoutError):  # nobody reads: the buffer fills, then the wait
            worker.send_bytes(b"x" * (8 << 20), timeout=0.05)
        sock.close()
    finally:
        ours.close()
        theirs.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_forker_out_of_descriptors_fails_the_fork_rather_than_drop_one() -> None:
    # SCM_RIGHTS into a process at its RLIMIT_NOFILE delivers the record and drops the
    # descriptors that do not fit (MSG_CTRUNC): a worker without its cgroup.procs would run
    # outside its memory cgroup, one without its socket would not run at all
    link = start_forker({"p": {"noop": noop}})
    spec = WorkerSpec(pool="p", slot=1, handlers={}, parent_pid=0)
    r, w = os.pipe()
    try:
        assert link.pid is not None
        link.fork_worker(spec, now=0.0).sock.close()  # an answer: it is in its loop, settled
        held = {int(fd) for fd in os.listdir(f"/proc/{link.pid}/fd")}
        free = [fd for fd in range(max(held) + 3) if fd not in held]
        hard = resource.prlimit(link.pid, resource.RLIMIT_NOFILE)[1]
        resource.prlimit(link.pid, resource.RLIMIT_NOFILE, (free[1] + 1, hard))  # 2 of 3 fit
        with pytest.raises(ForkFailed):
            link.fork_worker(spec, now=0.0, cgroup_fd=w)
    finally:
        link.close(1.0)
        os.close(r)
        os.close(w)


# ---- the hello's handler table (supervisor.run.forklink.handler_table) ----


def test_handlers_are_named_by_the_config_then_their_qualified_name_else_pickled() -> None:
    from supervisor.run.forklink import handler_table
    from workers.command import CommandHandler
    from workers.command_rules import CommandSpec

    command = CommandHandler(CommandSpec(argv=("true",)))
    table = handler_table(
        {"p": {"a": noop, "b": noop, "c": command}},
        {"p": {"a": "tests.unit.test_forker:noop", "b": "tests.unit.test_forker:absent"}},
    )
    assert table["p"]["a"] == ("import", "tests.unit.test_forker:noop")
    assert table["p"]["b"] == ("import", f"{noop.__module__}:noop")  # the config's is not it
    assert table["p"]["c"] == ("object", command)


def test_a_handler_the_forker_could_not_get_is_refused_at_once() -> None:
    from supervisor.run.forklink import handler_table

    with pytest.raises(ValueError, match=r"pools\.p: handler 'k'.*neither imported by name nor"):
        handler_table({"p": {"k": lambda payload: None}})
    main_handler = type(noop)(noop.__code__, {})  # a function that says it is __main__'s
    main_handler.__module__ = "__main__"
    with pytest.raises(ValueError, match="defined in __main__"):
        handler_table({"p": {"k": main_handler}})


def test_a_record_that_does_not_read_is_a_broken_forker_not_a_crash() -> None:
    import pickle

    from supervisor.run.forklink import ForkerGone, ForkLink

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.setblocking(False)
    link = ForkLink(None, ours)  # type: ignore[arg-type]  # no process: the socket alone
    for _ in range(2):  # past what one read takes: cut
        theirs.send(pickle.dumps(("broken", "x" * 100_000)))
    with pytest.raises(ForkerGone, match="does not read"):
        link._read()
    assert link.take_exits() == [] and link.gone  # the loop's way in: the forker is gone
    theirs.close()


def test_the_forkers_messages_are_capped() -> None:
    import pickle

    tag, text = pickle.loads(forker._message("broken", "é" * 10_000))
    assert tag == "broken" and len(text.encode()) <= forker.MESSAGE_AT_MOST
    assert text.endswith("[cut]")
