"""Command handlers with real supervisors, on both engines: a kind that runs a program.

Each outcome once: done with its result (JSON from stdout, the payload on stdin, the field
substituted into argv, the job's own folder as cwd, HOME and TMPDIR, gone afterwards); a
non-zero exit retried with stderr's tail in last_error; a permanent code dead at once; a
missing placeholder permanent without running anything; death by a signal ``crashed``; a
silent program stopped at stall_timeout; a hang (``sleep 1000``) a ``timeout`` within
timeout + 1 s with no ``sleep`` left; a program that allocates past memory_limit stopped as
``memory_limit``. Programs are python3, sh and sleep: on every machine that has Python.
"""

from __future__ import annotations

import os
import sys
import time

from supervisor.model import ErrorKind, JobState
from tests.integration.fleet import Harness, alive

PY = sys.executable

REPORT = (
    "import json, os, sys\n"
    "payload = json.load(sys.stdin)\n"
    "open('scratch', 'w').write('x')\n"
    "print(json.dumps({'argv': sys.argv[1:], 'doc': payload['doc'], 'cwd': os.getcwd(),\n"
    "    'home': os.environ['HOME'], 'tmp': os.environ['TMPDIR'],\n"
    "    'job': os.environ['FLEETD_JOB_ID'], 'secret': os.environ.get('FLEETD_TEST_SECRET'),\n"
    "    'own': os.environ.get('REPORT_MODE')}))\n"
)
# gradual: 8 MiB touched every 10 ms, the way a decoder's buffers grow
GROW = (
    "import json, os, sys, time\n"
    "open(json.load(sys.stdin)['mark'], 'w').write(os.getcwd())\n"
    "open('partial.out', 'wb').write(b'x' * 4096)\n"
    "held = []\n"
    "for _ in range(256):\n"
    "    held.append(b'x' * (8 << 20))\n"
    "    time.sleep(0.01)\n"
)
FAILS = "echo 'reading input' >&2; echo 'bad header on line 3' >&2; pwd >&2; exit 1"


def pools(memory_cgroup: bool = True) -> dict:
    commands = {
        "report": {
            "command": [PY, "-c", REPORT, "--doc={doc}", "{page}"],
            "env": {"REPORT_MODE": "full"},
        },
        "text": {"command": ["sh", "-c", "echo plain words; echo 'to stderr' >&2"]},
        "fails": {
            "command": [
                "sh",
                "-c",
                "echo 'reading input' >&2; echo 'bad header on line 3' >&2; pwd >&2; exit 1",
            ]
        },
        "refuses": {
            "command": ["sh", "-c", "echo 'not a PDF' >&2; exit 65"],
            "permanent_codes": [2, 65],
        },
        "needs": {"command": ["cat", "{path}"]},
        "segv": {"command": ["sh", "-c", "kill -SEGV $$"]},
        "silent": {
            "command": ["sh", "-c", "echo started; exec sleep 1000"],
            "stall_timeout": "500ms",
        },
        "hang": {"command": ["sleep", "1000"]},
    }
    return {
        "cmd": {
            "handlers": commands,
            "min_workers": 4,
            "max_workers": 4,
            "bound": "io",
            "timeout": "1500ms",
            "max_deliveries": 2,
            "retry_backoff": "100ms",
            "retry_backoff_max": "100ms",
            "lease": "10s",
            "pipeline": 1,
        },
        "grow": {
            "handlers": {
                "grow": {"command": [PY, "-c", GROW]},
                # fails at once on RLIMIT_DATA: MemoryError, before the watchdog sees it
                "instant": {"command": [PY, "-c", "b = bytearray(2 << 30)"]},
            },
            "min_workers": 1,
            "max_workers": 1,
            "bound": "io",
            "memory_limit": "128MiB",
            "max_deliveries": 1,
            "timeout": "30s",
        },
    }


def test_command_outcomes(fleet: Harness, monkeypatch, tmp_path) -> None:
    # the supervisor's environment (a database password, say) never reaches a program
    monkeypatch.setenv("FLEETD_TEST_SECRET", "hunter2")
    fleet.configure(pools())
    sup = fleet.start()
    sup.wait_workers(fleet.store, "cmd", 4)
    ids = {
        "report": fleet.enqueue("report", {"doc": "a b.pdf", "page": 7}),
        "text": fleet.enqueue("text"),
        "fails": fleet.enqueue("fails"),
        "refuses": fleet.enqueue("refuses"),
        "needs": fleet.enqueue("needs", {"other": 1}),
        "segv": fleet.enqueue("segv"),
        "silent": fleet.enqueue("silent"),
        "hang": fleet.enqueue("hang"),
        "grow": fleet.enqueue("grow", {"mark": str(tmp_path / "grow-cwd")}),
        "instant": fleet.enqueue("instant"),
    }
    jobs = dict(
        zip(ids, fleet.wait_final(list(ids.values()), timeout=40, watch=[sup]), strict=True)
    )

    report = jobs["report"]
    assert report.state == JobState.DONE, report
    out = report.result["json"]
    assert report.result["exit_code"] == 0
    assert out["argv"] == ["--doc=a b.pdf", "7"] and out["doc"] == "a b.pdf"
    assert out["cwd"] == out["home"] == out["tmp"] and out["job"] == str(report.id)
    assert out["secret"] is None, "the supervisor's environment reached the program"
    assert out["own"] == "full", "the handler's env table did not reach the program"
    assert os.path.basename(out["cwd"]).startswith("fleetd-job-")
    assert not os.path.exists(out["cwd"]), "the job's folder outlived it"

    assert jobs["text"].state == JobState.DONE
    assert jobs["text"].result == {"exit_code": 0, "text": "plain words\n"}

    fails = jobs["fails"]
    assert (fails.state, fails.error_kind, fails.attempts) == (
        JobState.DEAD,
        ErrorKind.EXCEPTION,
        2,
    )
    assert "sh exited with code 1" in fails.last_error
    assert "reading input | bad header on line 3" in fails.last_error
    folder = fails.last_error.rsplit(" | ", 1)[-1]  # pwd: its folder, gone after a failure too
    assert "fleetd-job-" in folder and not os.path.exists(folder)

    refuses = jobs["refuses"]
    assert (refuses.state, refuses.error_kind, refuses.attempts) == (
        JobState.DEAD,
        ErrorKind.PERMANENT,
        1,
    )
    assert "code 65 (a permanent code" in refuses.last_error and "not a PDF" in refuses.last_error

    needs = jobs["needs"]
    assert (needs.error_kind, needs.attempts) == (ErrorKind.PERMANENT, 1)
    assert "the payload has no field 'path'" in needs.last_error

    segv = jobs["segv"]
    assert segv.error_kind == ErrorKind.CRASHED and "killed by SIGSEGV" in segv.last_error

    silent = jobs["silent"]
    assert silent.error_kind == ErrorKind.TIMEOUT and "stall_timeout" in silent.last_error
    # the promise: stopped within stall_timeout (0.5 s) + 1 s; the message says which stop
    assert silent.duration is not None and silent.duration <= 0.5 + 1.0

    hang = jobs["hang"]
    assert hang.error_kind == ErrorKind.TIMEOUT and "past its timeout" in hang.last_error
    assert hang.attempts == 2
    # the promise: stopped within timeout + 1 s; not much before it (the deadline is counted
    # from when the supervisor sends the job, a little before the handler starts)
    assert hang.duration is not None and 1.5 - 0.25 <= hang.duration <= 1.5 + 1.0
    assert hang.finished_at - hang.started_at <= 2.5
    sleeps = [p for p in sup.alive_descendants() if _name(p) == "sleep"]
    assert not sleeps, f"sleep processes left: {sleeps}"
    assert sup.worker_processes(), "the workers stay (a command's stop kills the command only)"

    grow = jobs["grow"]
    assert grow.error_kind == ErrorKind.MEMORY_LIMIT, grow
    assert "memory_limit 128MiB" in grow.last_error
    instant = jobs["instant"]
    assert instant.error_kind == ErrorKind.MEMORY_LIMIT, instant
    # its worker was killed mid-job: the supervisor removed the worker's directory of folders
    folder = (tmp_path / "grow-cwd").read_text()
    worker_dir = os.path.dirname(folder)
    assert os.path.basename(os.path.dirname(worker_dir)) == f"fleetd-{sup.pid}", folder
    assert os.path.basename(worker_dir).startswith("grow-1-"), folder
    deadline = time.monotonic() + 2
    while os.path.exists(worker_dir) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(worker_dir), "a killed worker's job folder outlived it"


def _name(proc) -> str:
    try:
        return proc.name() if alive(proc) else ""
    except Exception:
        return ""
