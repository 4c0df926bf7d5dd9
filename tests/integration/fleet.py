"""Real supervisors for the integration tests.

- ``write_config``: a fleet.toml in a test's folder for a given database URL, with the repo
  root on ``python_path`` so ``tests.support.handlers:*`` import.
- ``Supervisor``: ``python -m supervisor start -c fleet.toml --node-id X`` as a subprocess
  (stdout and stderr to a log file), every descendant it ever had collected with psutil by a
  sampler thread, and stopped by pid: SIGTERM, wait, SIGKILL. The forks it made are counted
  exactly through ``forkaudit/sitecustomize.py`` (an audit hook on ``os.fork``).
- ``Harness``: one database, one config, the supervisors started on it, and the store the
  test inspects (with the real clock: the supervisor's and the test's times must agree).

Every wait polls the store (``tests.support.wait.eventually``), never a fixed sleep.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import psutil

from supervisor.client import Client
from supervisor.config import load_config
from supervisor.model import Job, JobState
from supervisor.store import Store
from tests.support.wait import eventually

REPO = Path(__file__).resolve().parents[2]
FORK_AUDIT = Path(__file__).resolve().parent / "forkaudit"
HOOKED_START = REPO / "tests" / "support" / "hooked_start.py"  # fleetd start with test seams
HANDLERS = "tests.support.handlers:"
FINAL = (JobState.DONE, JobState.DEAD)


def handlers(*names: str) -> dict[str, str]:
    """``{"echo": "tests.support.handlers:echo", ...}``: each kind named after its handler."""
    return {name: HANDLERS + name for name in names}


def toml_value(value: Any) -> str:
    """A Python value as TOML (strings, numbers, booleans, lists and inline tables)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str | Path):
        return json.dumps(str(value))  # JSON's escapes are valid in TOML basic strings
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        items = ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items())
        return "{ " + items + " }"
    raise TypeError(f"no TOML for {value!r}")


def write_config(
    folder: Path,
    database: str,
    pools: dict[str, dict[str, Any]],
    schedules: dict[str, dict[str, Any]] | None = None,
    **fleet: Any,
) -> Path:
    """Write ``folder/fleet.toml``; ``fleet`` keys override the short test defaults;
    ``schedules`` become ``[schedules.NAME]`` tables."""
    settings = {
        "database": database,
        "python_path": [str(REPO)],
        "grace_period": "1s",
        **fleet,
    }
    lines = ["[fleet]", *(f"{k} = {toml_value(v)}" for k, v in settings.items()), ""]
    for name, keys in pools.items():
        lines += [f"[pools.{name}]", *(f"{k} = {toml_value(v)}" for k, v in keys.items()), ""]
    for name, keys in (schedules or {}).items():
        lines += [f"[schedules.{name}]", *(f"{k} = {toml_value(v)}" for k, v in keys.items()), ""]
    path = folder / "fleet.toml"
    path.write_text("\n".join(lines))
    return path


def alive(proc: psutil.Process) -> bool:
    """Running and not a zombie (an exited process nobody reaped yet is dead for us)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class Supervisor:
    """One ``fleetd start`` subprocess and every descendant it was seen with."""

    def __init__(
        self, config: Path, node_id: str, folder: Path, run: int = 1, hooks: Sequence[str] = ()
    ) -> None:
        self.config = config
        self.hooks = tuple(hooks)  # hooked_start.py's arguments: test seams (run/hooks.py)
        self.node_id = node_id
        self.log_path = folder / f"supervisor-{node_id}-{run}.log"
        self.fork_log = folder / f"forks-{node_id}-{run}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.ps: psutil.Process | None = None
        self.seen: set[psutil.Process] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> Supervisor:
        path = [str(FORK_AUDIT), *filter(None, [os.environ.get("PYTHONPATH")])]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(path),
            "FLEETD_TEST_FORK_LOG": str(self.fork_log),
        }
        command = [sys.executable, "-m", "supervisor", "start", "-c", str(self.config)]
        if self.hooks:
            command = [sys.executable, str(HOOKED_START), *self.hooks, "-c", str(self.config)]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [*command, "--node-id", self.node_id],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.config.parent,
                env=env,
                start_new_session=True,  # a Ctrl-C at the test's terminal is not ours
            )
        self.ps = psutil.Process(self.proc.pid)
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()
        return self

    # ---- what it is doing -------------------------------------------------------------

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            self.track()

    def track(self) -> list[psutil.Process]:
        """Record the supervisor's descendants now; return the live ones."""
        if self.ps is None:
            return []
        try:
            children = self.ps.children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        with self._lock:
            self.seen.update(children)
        return [c for c in children if alive(c)]

    def forker_pids(self) -> set[int]:
        """Its forker now (workers/forker.py; a set: none while one is being replaced)."""
        out = set()
        for proc in self.track():
            try:
                if proc.ppid() == self.pid and proc.name() == "fleetd: forker":
                    out.add(proc.pid)
            except psutil.NoSuchProcess:
                continue
        return out

    def worker_processes(self) -> list[psutil.Process]:
        """Its live workers now: its forker's children (and, after the forker died, its own
        children but the store processes and the forker)."""
        forkers = self.forker_pids()
        out = []
        for proc in self.track():
            try:
                ppid, name = proc.ppid(), proc.name()
            except psutil.NoSuchProcess:
                continue
            if ppid in forkers or (
                ppid == self.pid and not name.startswith(("fleetd: store", "fleetd: forker"))
            ):
                out.append(proc)
        return out

    def descendant(self, pid: int) -> psutil.Process | None:
        """The descendant seen with ``pid``, if the sampler saw one."""
        with self._lock:
            return next((p for p in self.seen if p.pid == pid), None)

    def alive_descendants(self) -> list[psutil.Process]:
        with self._lock:
            seen = list(self.seen)
        return [p for p in seen if alive(p)]

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self) -> None:
        """Fail with the log when the supervisor exited while the test expected it running."""
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(
                f"supervisor {self.node_id} exited with {self.proc.returncode}:\n{self.log()}"
            )

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def forks(self) -> int:
        """How many workers were forked: the ``os.fork()`` calls of its forkers (a process
        whose parent is the supervisor; the store processes never fork)."""
        try:
            lines = self.fork_log.read_text().splitlines()
        except FileNotFoundError:
            return 0
        return sum(1 for line in lines if int(line.split()[1]) == self.pid)

    def node(self, store: Store) -> dict[str, Any] | None:
        """This process's node row (a row left by an earlier process of the same id is not)."""
        for row in store.list_nodes():
            if row["node_id"] == self.node_id and row["pid"] == self.pid:
                return row
        return None

    def snapshot(self, store: Store) -> dict[str, Any] | None:
        row = self.node(store)
        return json.loads(row["snapshot"]) if row and row["snapshot"] else None

    def workers(self, store: Store, pool: str) -> list[dict[str, Any]]:
        snap = self.snapshot(store)
        return snap["pools"][pool]["workers"] if snap else []

    def wait_running(self, store: Store, timeout: float = 20.0) -> dict[str, Any]:
        """Until the node row says running (registered, before the first fork)."""

        def registered() -> dict[str, Any] | None:
            self.check_alive()
            row = self.node(store)
            return row if row and row["state"] == "running" else None

        return eventually(registered, timeout=timeout)

    def wait_workers(self, store: Store, pool: str, count: int, state: str = "idle") -> None:
        """Until the published snapshot shows ``count`` workers of ``pool`` in ``state``."""

        def ready() -> bool:
            self.check_alive()
            return sum(w["state"] == state for w in self.workers(store, pool)) >= count

        eventually(ready, timeout=20.0)

    # ---- stopping ---------------------------------------------------------------------

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.track()
        os.kill(self.proc.pid, sig)

    def wait_exit(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self, timeout: float = 15.0) -> list[psutil.Process]:
        """SIGTERM, wait, SIGKILL; then the descendants still alive (none, or it is a bug)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._stop.set()
        if self._sampler is not None:
            self._sampler.join()
        with contextlib.suppress(AssertionError):  # children die with the parent (PDEATHSIG)
            eventually(lambda: not self.alive_descendants(), timeout=3.0)
        return self.alive_descendants()


class Harness:
    """One test's database, fleet.toml, supervisors, and a store to look at the queue."""

    def __init__(
        self,
        folder: Path,
        database: str,
        store: Store,
        launch: Callable[..., Supervisor],
    ) -> None:
        self.folder = folder
        self.database = database
        self.store = store
        self._launch = launch
        self.config: Path | None = None
        self.client: Client | None = None
        self.exec_log = folder / "executions.jsonl"

    def configure(
        self,
        pools: dict[str, dict[str, Any]],
        schedules: dict[str, dict[str, Any]] | None = None,
        **fleet: Any,
    ) -> Path:
        self.config = write_config(self.folder, self.database, pools, schedules, **fleet)
        self.client = Client(load_config(self.config), self.store)
        return self.config

    def start(
        self, node_id: str = "node-a", *, wait: bool = True, hooks: Sequence[str] = ()
    ) -> Supervisor:
        """A supervisor on the config; ``hooks``: test seams, as tests/support/hooked_start.py
        takes them (``["--no-kill", "timeout"]``)."""
        assert self.config is not None, "configure() first"
        sup = self._launch(self.config, node_id, hooks=hooks)
        if wait:
            sup.wait_running(self.store)
        return sup

    # ---- jobs -------------------------------------------------------------------------

    def enqueue(self, kind: str, payload: dict[str, Any] | None = None, **kw: Any) -> int:
        """Enqueue through the Client; ``log`` in the payload makes the handler record its run."""
        assert self.client is not None, "configure() first"
        return self.client.enqueue(kind, {"log": str(self.exec_log), **(payload or {})}, **kw)

    def job(self, job_id: int) -> Job:
        job = self.store.get(job_id)
        assert job is not None, f"job {job_id} is missing"
        return job

    def jobs(self, ids: Iterable[int]) -> list[Job]:
        return [self.job(i) for i in ids]

    def wait_final(
        self, ids: Sequence[int], timeout: float = 20.0, *, watch: Sequence[Supervisor] = ()
    ) -> list[Job]:
        """Until every job is done or dead (failing at once if a watched supervisor exits)."""

        def final() -> list[Job] | None:
            for sup in watch:
                sup.check_alive()
            jobs = self.jobs(ids)
            return jobs if all(j.state in FINAL for j in jobs) else None

        return eventually(final, timeout=timeout)

    def wait_state(self, ids: Sequence[int], state: JobState, timeout: float = 20.0) -> list[Job]:
        def reached() -> list[Job] | None:
            jobs = self.jobs(ids)
            return jobs if all(j.state == state for j in jobs) else None

        return eventually(reached, timeout=timeout)

    def executions(self, job_id: int | None = None) -> list[dict[str, Any]]:
        """The handlers' execution log (one line per run that recorded itself)."""
        try:
            text = self.exec_log.read_text()
        except FileNotFoundError:
            return []
        runs = [json.loads(line) for line in text.splitlines() if line.strip()]
        return [r for r in runs if job_id is None or r["job"] == job_id]


def wait_gone(procs: Iterable[psutil.Process], timeout: float) -> float:
    """Seconds until none of ``procs`` is alive; fails after ``timeout``."""
    procs = list(procs)
    start = time.monotonic()
    eventually(lambda: not any(alive(p) for p in procs), timeout=timeout, interval=0.01)
    return time.monotonic() - start
