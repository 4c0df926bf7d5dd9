"""The frames between the loop and its store process: a 4-byte length, then a pickle of
``(request id, request)`` one way and ``(request id, Reply)`` the other; request id ``WAKE``
carries the pools a wake-up named, unasked.
"""

from __future__ import annotations

import pickle
import socket
import struct
from typing import Any

HEADER = struct.Struct("!I")
WAKE = -1  # request id of an unsolicited message: pools named by a wake-up
CHUNK = 64 << 10  # bytes one read of the socket takes at most (a longer frame: several)


def frame(message: Any) -> bytes:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(body)) + body


def receive(sock: socket.socket, inbox: bytearray, chunk: memoryview) -> int:
    """Read what ``sock`` holds (up to the chunk's size) onto ``inbox``; the bytes read, 0 at
    EOF. Into a buffer kept for the process: ``recv(1 MiB)`` had the allocator map, shrink
    and unmap a megabyte for every request in the store process (three system calls, seen
    with strace)."""
    n = sock.recv_into(chunk)
    inbox += chunk[:n]
    return n


def next_frame(buffer: bytearray) -> Any | None:
    """The first complete frame in ``buffer``, unpickled and removed; None if there is none."""
    if len(buffer) < HEADER.size:
        return None
    (size,) = HEADER.unpack_from(buffer, 0)
    if len(buffer) - HEADER.size < size:
        return None
    message = pickle.loads(buffer[HEADER.size : HEADER.size + size])
    del buffer[: HEADER.size + size]
    return message


def frames(buffer: bytearray) -> list[Any]:
    """Every complete frame at the start of ``buffer``, unpickled; removed from it."""
    out: list[Any] = []
    at = 0
    while len(buffer) - at >= HEADER.size:
        (size,) = HEADER.unpack_from(buffer, at)
        if len(buffer) - at - HEADER.size < size:
            break
        start = at + HEADER.size
        out.append(pickle.loads(buffer[start : start + size]))
        at = start + size
    del buffer[:at]
    return out
