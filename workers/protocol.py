"""The parent ⇄ worker wire format: length-prefixed JSON frames over one socket (or pipe) fd.

A frame is a 4-byte big-endian body length, then the body: one UTF-8 JSON array of the
protocol version, the message type and the message's fields in their declared order::

    00 00 00 0e  [2,"Ping",7]

(An array, not an object with named fields: both ends are the same code, and a frame goes each
way for every job, so the names were most of a short frame and a third of its decoding.)

Messages, one frozen dataclass each::

    parent → child   RunJob(job_id, kind, payload, attempt, deadline, token)
                     Ping(seq)                  Shutdown()          Release()
    child → parent   Ready(pid)                 Returned(job_id)
                     JobDone(job_id, result, duration, peak_rss)
                     JobFailed(job_id, error_kind, message, traceback_tail, duration, peak_rss)
                     Pong(seq, rss)             Recycling(reason)

The parent may send several ``RunJob`` frames ahead (a pipeline): the worker runs them one
after the other, in order, and answers each with its result; a result means the next one has
started. ``Release`` asks for the ones not started yet back: each comes back as ``Returned`` and
is never run.

``payload`` and ``result`` are JSON *text* carried as strings: the parent stores and forwards
them without parsing, and only the child parses the payload. Sizes are bytes, durations seconds,
``deadline`` Unix time. Decoding is strict (unknown type, missing or extra field, wrong type,
other version: ``ProtocolError``), because both ends always run the same code: the worker is a
fork of the parent. A ``ProtocolError`` leaves the stream out of step; the only safe reaction is
to close the connection and end the worker.

Both ends feed the bytes they read into a ``FrameReader`` (one read can bring several frames);
``read_frame`` and ``write_frame`` are the blocking one-frame forms.
"""

from __future__ import annotations

import json
import mmap
import operator
import os
import signal
import struct
import types
import typing
from dataclasses import dataclass

VERSION = 2  # 1 was a JSON object per frame
MAX_FRAME = 16 * 1024 * 1024  # bytes of body; a larger result is refused in the child
HEADER = struct.Struct(">I")

# JobFailed.error_kind values: the subset of the parent's ErrorKind a child can report itself.
EXCEPTION = "exception"
PERMANENT = "permanent"
MEMORY_LIMIT = "memory_limit"
TIMEOUT = "timeout"  # the handler stopped on SoftTimeout; a command stopped at its deadline
CRASHED = "crashed"  # a command handler's program died by a signal
ERROR_KINDS = frozenset({EXCEPTION, PERMANENT, MEMORY_LIMIT, TIMEOUT, CRASHED})
SOFT_TIMEOUT_SIGNAL = 10  # SIGUSR1: the parent's "your job is past its timeout"
# the parent's "an operator cancelled your job": a flag for current_job(), never a raise. A
# real-time signal nothing else uses (limits.DEADLINE_SIGNAL is SIGRTMIN + 3)
CANCEL_SIGNAL = signal.SIGRTMIN + 4


class CancelSlot:
    """Which job ``CANCEL_SIGNAL`` is about: one job id in a page shared by the parent and one
    worker. The parent writes the id, then signals; the worker's handler acts only when it
    names the job it runs, so a signal that arrives late (that job ended, the next of a
    pipeline runs) is a no-op, not a cancel of the wrong job. 0: nothing asked.

    ``CancelSlot()`` maps an anonymous shared page (both sides of a fork made after it see
    it); ``CancelSlot.shared()`` a memfd's, whose fd another process (the forker) can hand to
    the worker: ``CancelSlot.adopt(fd)`` maps it there."""

    __slots__ = ("_page",)

    def __init__(self, fd: int = -1) -> None:
        self._page = mmap.mmap(fd, 8)  # MAP_SHARED: every process mapping it sees the writes

    @classmethod
    def shared(cls) -> tuple[CancelSlot, int]:
        """A slot on a new memfd, and that fd (the caller closes it once it is handed on)."""
        fd = os.memfd_create("fleetd-cancel", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, 8)
            return cls(fd), fd
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def adopt(cls, fd: int) -> CancelSlot:
        """The slot of the memfd ``fd`` received from the parent, which is closed: mmap keeps
        a close-on-exec copy of its own, and the received one would be inherited by every
        program the job runs."""
        try:
            return cls(fd)
        finally:
            os.close(fd)

    def write(self, job_id: int) -> None:
        struct.pack_into("=q", self._page, 0, job_id)

    def read(self) -> int:
        return struct.unpack_from("=q", self._page, 0)[0]

    def close(self) -> None:
        self._page.close()


class ProtocolError(Exception):
    """A frame could not be encoded or decoded; the connection is no longer usable."""


class FrameTooLarge(ProtocolError):
    """A frame's body is over the size limit (raised on the length prefix, before the body)."""


@dataclass(frozen=True, slots=True)
class RunJob:
    """Run one job. ``payload`` is JSON text; ``deadline`` the Unix time of the kill at the
    earliest (a job queued behind others gets its timeout from when it starts)."""

    job_id: int
    kind: str
    payload: str
    attempt: int
    deadline: float
    token: str


@dataclass(frozen=True, slots=True)
class Ping:
    """Are you alive, and how big are you? Answered with ``Pong`` between jobs."""

    seq: int


@dataclass(frozen=True, slots=True)
class Shutdown:
    """Exit with ``exitcodes.OK``. Read between jobs only: it never interrupts a job."""


@dataclass(frozen=True, slots=True)
class Release:
    """Hand back every ``RunJob`` received but not started (each as ``Returned``): a drain.
    Read before the next queued job starts, not while one runs."""


@dataclass(frozen=True, slots=True)
class Ready:
    """Setup is done and the worker waits for jobs."""

    pid: int


@dataclass(frozen=True, slots=True)
class Returned:
    """``job_id`` was received but will never be started here (answer to ``Release``)."""

    job_id: int


@dataclass(frozen=True, slots=True)
class JobDone:
    """The handler returned. ``result`` is JSON text; ``peak_rss`` is this job's VmHWM."""

    job_id: int
    result: str
    duration: float
    peak_rss: int | None


@dataclass(frozen=True, slots=True)
class JobFailed:
    """The handler raised. ``error_kind`` is one of ``ERROR_KINDS``; ``message`` one line."""

    job_id: int
    error_kind: str
    message: str
    traceback_tail: str
    duration: float
    peak_rss: int | None


@dataclass(frozen=True, slots=True)
class Pong:
    """Answer to ``Ping``, with the worker's current RSS in bytes (None if unknown)."""

    seq: int
    rss: int | None


@dataclass(frozen=True, slots=True)
class Recycling:
    """The worker is about to exit with ``exitcodes.RECYCLE``, right after a result.

    Any ``RunJob`` the parent sent after that result is never started: release it. (A handler
    that exits with code 83 itself sent no Recycling: that is a crash.)
    """

    reason: str


Message = (
    RunJob | Ping | Shutdown | Release | Ready | Returned | JobDone | JobFailed | Pong | Recycling
)
_CLASSES: tuple[type, ...] = typing.get_args(Message)


def _accepted(annotation: object) -> tuple[type, ...]:
    """The Python types a JSON value may have for a field annotation (floats accept ints)."""
    if isinstance(annotation, types.UnionType):
        return tuple(t for arg in typing.get_args(annotation) for t in _accepted(arg))
    if annotation is float:
        return (float, int)
    if annotation is type(None) or annotation is None:
        return (type(None),)
    return (typing.cast(type, annotation),)


_Layout = tuple[type, tuple[str, ...], tuple[tuple[type, ...], ...], tuple[int, ...]]


def _layout(cls: type) -> _Layout:
    """A message type's fields in declaration order (the order on the wire), the JSON types
    each accepts, and the positions of its floats."""
    hints = typing.get_type_hints(cls)
    return (
        cls,
        tuple(hints),
        tuple(_accepted(hint) for hint in hints.values()),
        tuple(i for i, hint in enumerate(hints.values()) if hint is float),
    )


def _getter(names: tuple[str, ...]) -> typing.Callable[[typing.Any], tuple[object, ...]]:
    """A message's field values as a tuple, in ``names`` order."""
    if len(names) > 1:
        return operator.attrgetter(*names)
    return lambda msg: tuple(getattr(msg, name) for name in names)


_LAYOUT = {cls.__name__: _layout(cls) for cls in _CLASSES}
_GETTERS = {cls: _getter(_LAYOUT[cls.__name__][1]) for cls in _CLASSES}
# One encoder for every frame: json.dumps with options builds a new encoder on each call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
_DECODER = json.JSONDecoder()


def encode(msg: Message, max_size: int = MAX_FRAME) -> bytes:
    """One complete frame (length prefix and body) for ``msg``.

    Raises ``FrameTooLarge`` when the body would exceed ``max_size``.
    """
    cls = type(msg)
    data = _ENCODER.encode([VERSION, cls.__name__, *_GETTERS[cls](msg)]).encode()
    if len(data) > max_size:
        raise FrameTooLarge(f"{cls.__name__} frame of {len(data)} bytes > {max_size}")
    return HEADER.pack(len(data)) + data


def decode(frame: bytes) -> Message:
    """The message in one complete frame (length prefix and body), as ``encode`` made it."""
    if len(frame) < HEADER.size or HEADER.unpack_from(frame)[0] != len(frame) - HEADER.size:
        raise ProtocolError(f"not one complete frame ({len(frame)} bytes)")
    return decode_body(frame[HEADER.size :])


def decode_body(body: bytes) -> Message:
    """The message in a frame body (the JSON array after the length prefix)."""
    try:
        obj = _DECODER.decode(body.decode("utf-8"))
    except ValueError as exc:  # UnicodeDecodeError is a ValueError too
        raise ProtocolError(f"frame body is not JSON: {exc}") from exc
    if type(obj) is not list or len(obj) < 2:
        raise ProtocolError("frame body is not a JSON array [version, type, fields...]")
    version, name, *values = obj
    if type(version) is not int or version != VERSION:
        raise ProtocolError(f"protocol version {version!r}, expected {VERSION}")
    layout = _LAYOUT.get(name) if type(name) is str else None
    if layout is None:
        raise ProtocolError("frame has an unknown or missing message type")
    cls, names, accepted, floats = layout
    if len(values) != len(names):
        raise ProtocolError(f"{name} has {len(values)} fields, expected {len(names)}: {names}")
    for field, value, types_ in zip(names, values, accepted, strict=True):
        if value.__class__ is bool or not isinstance(value, types_):
            raise ProtocolError(f"{name}.{field} has the wrong type: {value!r}")
    if cls is JobFailed and values[1] not in ERROR_KINDS:
        raise ProtocolError(f"JobFailed.error_kind {values[1]!r} is not a known kind")
    for i in floats:
        values[i] = float(values[i])  # JSON writes 2.0 as 2.0 but a Python int 2 as 2
    return typing.cast(Message, cls(*values))


def write_frame(fd: int, msg: Message, max_size: int = MAX_FRAME) -> None:
    """Write one frame to a blocking fd, all of it (partial writes are resumed).

    Raises ``BrokenPipeError`` (or another ``OSError``) when the other end is gone.
    """
    view = memoryview(encode(msg, max_size))
    while view:
        view = view[os.write(fd, view) :]


def read_frame(fd: int, max_size: int = MAX_FRAME) -> Message | None:
    """Read one message from a blocking fd; None on end of file between frames.

    End of file inside a frame, or a length over ``max_size``, raises ``ProtocolError``.
    """
    header = _read_exact(fd, HEADER.size)
    if header is None:
        return None
    (size,) = HEADER.unpack(header)
    if size > max_size:
        raise FrameTooLarge(f"frame of {size} bytes > {max_size}")
    body = _read_exact(fd, size)
    if body is None:
        raise ProtocolError(f"end of file inside a {size}-byte frame")
    return decode_body(body)


def _read_exact(fd: int, n: int) -> bytes | None:
    """Exactly ``n`` bytes; None on EOF before the first byte; ProtocolError on EOF after it."""
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            if buf:
                raise ProtocolError(f"end of file after {len(buf)} of {n} bytes")
            return None
        buf += chunk
    return bytes(buf)


class FrameReader:
    """Incremental decoder for the parent: feed it bytes as they arrive, get whole messages.

    Owned by one thread (the parent's loop). After a ``ProtocolError`` the stream is out of
    step and the reader must not be fed again.
    """

    def __init__(self, max_size: int = MAX_FRAME) -> None:
        self._buf = bytearray()
        self._max_size = max_size

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame held back (non-zero at EOF means a truncated frame)."""
        return len(self._buf)

    def feed(self, data: bytes, out: list[Message] | None = None) -> list[Message]:
        """Append ``data``; return every message now complete, in order (appended to ``out``
        when given: on a ``ProtocolError`` it holds the messages decoded before the bad frame)."""
        buf = self._buf
        buf += data
        if out is None:
            out = []
        while len(buf) >= HEADER.size:
            (size,) = HEADER.unpack_from(buf)
            if size > self._max_size:
                raise FrameTooLarge(f"frame of {size} bytes > {self._max_size}")
            end = HEADER.size + size
            if len(buf) < end:
                break
            body = bytes(buf[HEADER.size : end])
            del buf[:end]  # cheap: CPython moves a bytearray's start instead of copying
            out.append(decode_body(body))
        return out

    def drain(
        self, fd: int, bufsize: int = 65536
    ) -> tuple[list[Message], bool, ProtocolError | OSError | None]:
        """Everything a non-blocking fd holds now, decoded; whether it reached its end; and
        what broke it, if anything (a bad frame, a read error such as a reset), which ends it
        too. The messages decoded before the break come first, all of them: one read can hold
        a result and then a bad frame. (A pipelining worker that exits can leave more than one
        read's worth behind it.)"""
        out: list[Message] = []
        try:
            while True:
                try:
                    data = os.read(fd, bufsize)
                except BlockingIOError:
                    return out, False, None
                if not data:
                    return out, True, None
                self.feed(data, out)
        except (ProtocolError, OSError) as exc:
            return out, True, exc
