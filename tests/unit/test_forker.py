"""The forker's protocol with real processes: every worker it forks is reported exited exactly
once, also when its exit is read together with the answer to another fork request."""

from __future__ import annotations

import doctest
import select

from supervisor.run.forklink import start_forker
from workers import forker, protocol
from workers.runtime import WorkerSpec


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
