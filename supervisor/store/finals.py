"""Wake-ups for waiters (``Client.wait``): a job reached a final state (done, dead, cancelled).

Whoever makes a job final tells the waiters; a waiter registers before its first read of the
job, so no final state can fall between that read and its wait. Polling stays the waiter's
safety net (a lost wake-up, a sender that crashed between its commit and its send).

- PostgreSQL: ``NOTIFY fleetd_final`` in the transaction that makes jobs final (its ack
  statement, a fail that dead-letters, a cancel, a reap), once per batch, its payload the ids
  (``final_payload``), and only while somebody waits: a waiter ``LISTEN``s on a connection of
  its own and then holds the advisory locks ``(WAITERS_LOCK, 0..WAITER_STRIPES-1)`` shared
  for the length of its wait (``PostgresFinalWatch``); the ending transaction tries to take
  one of them, picked at random, exclusively (``ENDER_TRY``: ``pg_try_advisory_xact_lock``, a
  lock-table entry, never a wait) and notifies only when that fails. A NOTIFY is not free:
  its commit takes the server's notification lock and signals every listening session of
  the database (each supervisor's). No final state slips through: an ending transaction that
  took its stripe holds it to its commit, so a waiter that registers meanwhile waits for that
  commit (at most ``LOCK_WAIT``, then it polls) and then reads the job final; one that
  registered first makes the try fail, and hears the NOTIFY. A concurrent ending transaction
  that picked the same stripe also makes a try fail (one NOTIFY nobody needs): with one lock
  for all, 3 processes acking at once notified for 40% of their acks with nobody waiting;
  stripes make it one overlap in ``WAITER_STRIPES``. Channels and locks are per database,
  not per schema: another schema's waiters cost NOTIFYs, and its ids one read each.
- SQLite: a waiter binds a datagram socket in ``<wake folder>/waiters/`` and then counts one up
  in ``<wake folder>/waiters.gen`` (``LocalFinalWatch``). A process that committed final
  states (``FinalAnnouncer``) reads that counter through a shared mapping, which is a memory
  read, not a system call; it lists the folder only when the counter moved, and sends the ids
  to each waiter there after its commit. With nobody waiting, the result path pays no system
  call at all. A waiter's queue holds only ``net.unix.max_dgram_qlen`` datagrams (10 by
  default): a datagram that does not fit is owed (the next one to that waiter says "re-read
  everything"), and a waiter that finds its queue full re-reads all its jobs.

What it cannot do: a waiter of another user, or on another host, is never told on SQLite
(the folder is per user, mode 0700); it polls. A process of the same user that truncates
``waiters.gen`` below 8 bytes while an announcer has it mapped kills that process (SIGBUS on
the memory read): the price of reading the counter without a system call; nothing of
fleetd's shrinks the file (a tmp cleaner removes it, which is harmless: see ``_attach``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import math
import mmap
import os
import select
import socket
import stat
import struct
import time
from array import array
from pathlib import Path
from typing import Any

from supervisor.store.wake import wake_folder

FINAL_CHANNEL = "fleetd_final"
# advisory locks (two keys: this, and a stripe; fleetd's others: migration 0x0F1EE7D with one
# bigint key, claims 0x0F1EE7C with two) that waiters hold shared, every stripe, while they
# wait; an ending transaction tries one stripe exclusively, so two ending at once rarely
# collide. Each stripe is a lock-table entry per waiter (the table holds
# max_locks_per_transaction x max_connections, 6,400 by default): few stripes.
WAITERS_LOCK = 0x0F1EE7E
WAITER_STRIPES = 16
# SQL: an ending transaction's try (random() < 1, so floor() gives 0..WAITER_STRIPES-1)
ENDER_TRY = (
    f"pg_try_advisory_xact_lock({WAITERS_LOCK}, "
    f"CAST(floor(random() * {WAITER_STRIPES}) AS integer))"
)
# SQL: a waiter takes (and lets go of) every stripe, in one statement
WAITER_LOCK = (
    f"SELECT count(pg_advisory_lock_shared({WAITERS_LOCK}, s)) "
    f"FROM generate_series(0, {WAITER_STRIPES - 1}) AS s"
)
WAITER_UNLOCK = WAITER_LOCK.replace("pg_advisory_lock_shared", "pg_advisory_unlock_shared")
# a PostgreSQL payload holds at most 8000 bytes: past this many ids it says "*" (re-read all)
PAYLOAD_IDS = 300
# a SQLite datagram past this many ids says b"" (re-read all) instead
DATAGRAM_IDS = 4096
WAITERS = "waiters"
COUNTER = "waiters.gen"
# the longest a PostgreSQL waiter waits for the waiters' lock before it polls instead
LOCK_WAIT = 1.0
LONGEST_WAIT = 86400.0  # seconds: what one wait of a SQLite watch blocks at most
RECHECK = 10.0  # seconds between an announcer's checks that its counter file is still the one
_seq = itertools.count(1)

# What a watch's wait returns: the ids it was told are final (possibly none: the time ran
# out), or EVERYTHING when it cannot tell which (a full queue, "*", a channel that broke).
EVERYTHING = None


def final_payload(ids: list[int] | tuple[int, ...]) -> str:
    """The NOTIFY payload for jobs made final in one transaction."""
    if len(ids) > PAYLOAD_IDS:
        return "*"
    return ",".join(map(str, ids))


def parse_payload(text: str) -> frozenset[int] | None:
    """The ids a NOTIFY payload names, or EVERYTHING (``*`` or anything unreadable)."""
    try:
        return frozenset(int(i) for i in text.split(",")) if text and text != "*" else None
    except ValueError:
        return EVERYTHING


def _counter_fd(folder: Path) -> int:
    """The waiters' counter file, opened (and made, 8 bytes) in ``folder``.

    The folder's name in the shared temporary directory can be foretold, so another user may
    have made it first, with a link named like the counter to a file of ours: we would write
    into that file. So the folder must be a real directory of ours that nobody else can
    write to, and the counter is never opened through a link (``OSError`` otherwise: the
    waiter polls, the announcer tells nobody)."""
    folder.mkdir(mode=0o700, exist_ok=True)
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PermissionError(errno.EPERM, "not a folder of this user's alone", str(folder))
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
    fd = os.open(folder / COUNTER, flags, 0o600)
    if os.fstat(fd).st_size < 8:
        os.ftruncate(fd, 8)  # concurrent openers agree: it only ever grows to 8
    return fd


# ---- SQLite: the side that makes jobs final ---------------------------------------------


class FinalAnnouncer:
    """Sends the ids of jobs made final to this host's waiters on one SQLite file. Best
    effort, never raises, never blocks: a waiter that is not told polls."""

    def __init__(self, database_path: str) -> None:
        self.folder = wake_folder(database_path)
        self._map: mmap.mmap | None = None
        self._inode: tuple[int, int] | None = None
        self._check_at = 0.0
        self._seen = b""
        self._targets: list[str] = []
        self._owed: set[str] = set()
        self._sock: socket.socket | None = None

    def announce(self, ids: list[int] | tuple[int, ...]) -> None:
        if not ids:
            return
        if time.monotonic() >= self._check_at:  # a clock read, not a system call (vDSO)
            self._attach()
        if self._map is None:
            return
        counter = self._map[:8]
        if counter != self._seen:  # a waiter registered since we last looked
            self._seen = counter
            self._targets = self._list()
        if self._targets:
            self._send(ids)

    def _attach(self) -> None:
        """Map the counter file, or map it again when it was replaced (a tmp cleaner)."""
        self._check_at = time.monotonic() + RECHECK
        try:
            st = os.stat(self.folder / COUNTER)
            if self._map is not None and (st.st_dev, st.st_ino) == self._inode:
                return
        except OSError:
            pass
        try:
            fd = _counter_fd(self.folder)
        except OSError:
            self._map = None
            return
        try:
            st = os.fstat(fd)
            self._map = mmap.mmap(fd, 8, mmap.MAP_SHARED, mmap.PROT_READ)
            self._inode = (st.st_dev, st.st_ino)
            self._seen = b""  # list the folder at once: waiters may be there already
        except OSError:
            self._map = None
        finally:
            os.close(fd)

    def _list(self) -> list[str]:
        try:
            with os.scandir(self.folder / WAITERS) as entries:
                return [e.path for e in entries if e.name.endswith(".sock")]
        except OSError:
            return []

    def _send(self, ids: list[int] | tuple[int, ...]) -> None:
        if self._sock is None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sock.setblocking(False)
        data = array("q", ids).tobytes() if len(ids) <= DATAGRAM_IDS else b""
        for target in list(self._targets):
            owed = target in self._owed
            try:
                self._sock.sendto(b"" if owed else data, target)
                self._owed.discard(target)
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.ENOBUFS):
                    self._owed.add(target)  # its queue is full: it re-reads all anyway
                else:  # ECONNREFUSED, ENOENT: its waiter is gone
                    with contextlib.suppress(ValueError):  # another thread's store call
                        self._targets.remove(target)
                    self._owed.discard(target)
                    if exc.errno == errno.ECONNREFUSED:
                        with contextlib.suppress(OSError):
                            os.unlink(target)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        if self._map is not None:
            self._map.close()


# ---- the waiting side ---------------------------------------------------------------------


class LocalFinalWatch:
    """A waiter's end on SQLite: a datagram socket in the folder's ``waiters/``, registered
    (the counter moved) before the caller's first read."""

    def __init__(self, database_path: str) -> None:
        self.broken = False  # a socket does not break; the attribute is the watches' API
        folder = wake_folder(database_path)
        fd = _counter_fd(folder)
        try:
            (folder / WAITERS).mkdir(mode=0o700, exist_ok=True)
            self.path = str(folder / WAITERS / f"{os.getpid()}-{next(_seq)}.sock")
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)  # an earlier process's, with our pid
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            try:
                self.sock.bind(self.path)
                self.sock.setblocking(False)
                _count_up(fd)
            except OSError:
                self.close()
                raise
        finally:
            os.close(fd)
        self._poll = select.poll()
        self._poll.register(self.sock, select.POLLIN)
        self.full = _queue_length()

    def wait(self, timeout: float) -> frozenset[int] | None:
        """The ids announced within ``timeout`` s (empty: none), or EVERYTHING."""
        # poll, not select: an application may hold more than 1024 descriptors; its timeout
        # is a C int of ms (an infinite wait, a poll of inf: at most a day, then it says none)
        if not self._poll.poll(math.ceil(min(max(0.0, timeout), LONGEST_WAIT) * 1000)):
            return frozenset()
        ids: set[int] = set()
        seen = 0
        while True:
            try:
                data = self.sock.recv(65536)
            except BlockingIOError:
                break
            seen += 1
            if not data:
                return EVERYTHING
            ids.update(array("q", data[: len(data) // 8 * 8]))
        return EVERYTHING if seen >= self.full else frozenset(ids)

    def close(self) -> None:
        self.sock.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)


def _count_up(fd: int) -> None:
    """Move the counter (under an exclusive lock: two waiters registering at once must not
    both write the same value, or an announcer could miss the second)."""
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        (value,) = struct.unpack("<Q", os.pread(fd, 8, 0).ljust(8, b"\0"))
        os.pwrite(fd, struct.pack("<Q", (value + 1) % 2**64), 0)
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def _queue_length() -> int:
    """How many datagrams a waiter's socket queues before senders are refused."""
    try:
        return max(2, int(Path("/proc/sys/net/unix/max_dgram_qlen").read_text()))
    except (OSError, ValueError):
        return 10


def local_supervisor_present(database_path: str) -> bool:
    """Whether a supervisor of this user on this host uses the file (its enqueue wake-up
    socket is in the folder): if none is, nobody here will announce final states."""
    try:
        with os.scandir(wake_folder(database_path)) as entries:
            return any(e.name.endswith(".sock") for e in entries)
    except OSError:
        return False


class PostgresFinalWatch:
    """A waiter's end on PostgreSQL: ``LISTEN fleetd_final`` and the waiters' lock held shared,
    on a connection of the store's (kept between waits); both let go at the end: a connection
    that listens and is not read would hold back the server's notification queue for every
    session, and a lock held would have every ending transaction notify."""

    def __init__(self, conn: Any, give_back: Any, within: float = math.inf) -> None:
        self.conn = conn
        self._give_back = give_back
        self.broken = False
        list(conn.notifies(timeout=0))  # stale ones from an earlier wait
        # one round trip: listen first, so any try that fails once the lock is ours is heard.
        # The lock waits for an ending transaction that took it to commit, which is at once
        # unless that transaction is stuck (its node cut off before its COMMIT, a synchronous
        # standby gone): bounded, so a wait keeps its timeout; psycopg.Error past it (the
        # LISTEN is rolled back with it) and the waiter polls.
        wait_ms = max(1, math.ceil(min(max(within, 0.0), LOCK_WAIT) * 1000))  # 0: no limit
        conn.execute(f"LISTEN {FINAL_CHANNEL}; SET lock_timeout = {wait_ms}; {WAITER_LOCK}")

    def wait(self, timeout: float) -> frozenset[int] | None:
        ids: set[int] = set()
        try:
            for note in self.conn.notifies(timeout=max(0.0, timeout), stop_after=1):
                named = parse_payload(note.payload)
                if named is EVERYTHING:
                    return EVERYTHING
                ids |= named
            for note in self.conn.notifies(timeout=0):  # the rest of what has arrived
                named = parse_payload(note.payload)
                if named is EVERYTHING:
                    return EVERYTHING
                ids |= named
        except Exception:  # the connection is gone: the caller polls from here on
            self.broken = True
            return EVERYTHING
        return frozenset(ids)

    def close(self) -> None:
        if not self.broken:
            try:
                self.conn.execute(f"{WAITER_UNLOCK}; UNLISTEN {FINAL_CHANNEL}")
            except Exception:
                self.broken = True
        if self.broken:
            with contextlib.suppress(Exception):
                self.conn.close()
        else:
            self._give_back(self.conn)
