"""The worker wire format: round trips, partial frames, oversize and malformed frames."""

from __future__ import annotations

import json
import os
import socket

import pytest

from workers import exitcodes, protocol
from workers.protocol import (
    FrameReader,
    FrameTooLarge,
    JobDone,
    JobFailed,
    Ping,
    Pong,
    ProtocolError,
    Ready,
    Recycling,
    Release,
    Returned,
    RunJob,
    Shutdown,
)

ALL = [
    RunJob(1234, "render", '{"doc": 42, "name": "é"}', 2, 1_900_000_000.5, "tok-1"),
    Ping(7),
    Shutdown(),
    Ready(4321),
    Release(),
    Returned(1234),
    JobDone(1234, '{"pages": 3}', 0.25, 104_857_600),
    JobDone(1234, "null", 0.0, None),
    JobFailed(1234, "memory_limit", "MemoryError: refused", "  File x, line 1", 1.5, 1 << 30),
    Pong(7, 12_345_678),
    Pong(8, None),
    Recycling("max_jobs_per_worker reached (100 jobs)"),
]


def body(obj: object) -> bytes:
    """A frame around an arbitrary JSON value, to forge malformed messages."""
    data = json.dumps(obj).encode()
    return protocol.HEADER.pack(len(data)) + data


@pytest.mark.parametrize("msg", ALL, ids=lambda m: type(m).__name__)
def test_encode_decode_round_trip(msg: protocol.Message) -> None:
    frame = protocol.encode(msg)
    assert protocol.HEADER.unpack_from(frame)[0] == len(frame) - 4
    assert protocol.decode(frame) == msg


def test_frame_is_length_prefixed_json_with_version() -> None:
    frame = protocol.encode(Ping(7))
    assert frame[:4] == len(frame[4:]).to_bytes(4, "big")
    assert json.loads(frame[4:]) == [protocol.VERSION, "Ping", 7]
    run = json.loads(protocol.encode(ALL[0])[4:])
    assert run == [
        protocol.VERSION,
        "RunJob",
        1234,
        "render",
        ALL[0].payload,
        2,
        1.9e9 + 0.5,
        "tok-1",
    ]


def test_float_fields_come_back_as_floats() -> None:
    msg = protocol.decode(protocol.encode(JobDone(1, "null", 2, None)))  # type: ignore[arg-type]
    assert isinstance(msg, JobDone) and isinstance(msg.duration, float)


def test_reader_yields_messages_fed_one_byte_at_a_time() -> None:
    stream = b"".join(protocol.encode(m) for m in ALL)
    reader = FrameReader()
    got = []
    for i in range(len(stream)):
        got.extend(reader.feed(stream[i : i + 1]))
    assert got == ALL and reader.pending == 0


def test_reader_yields_several_messages_from_one_chunk_and_keeps_the_partial_one() -> None:
    stream = b"".join(protocol.encode(m) for m in ALL[:3])
    reader = FrameReader()
    assert reader.feed(stream + protocol.encode(Ping(9))[:6]) == ALL[:3]
    assert reader.pending == 6
    assert reader.feed(protocol.encode(Ping(9))[6:]) == [Ping(9)]


def test_reader_rejects_an_oversize_frame_from_its_header_alone() -> None:
    reader = FrameReader(max_size=1024)
    with pytest.raises(FrameTooLarge):
        reader.feed(protocol.HEADER.pack(1025))


def test_encode_refuses_a_frame_over_the_limit() -> None:
    with pytest.raises(FrameTooLarge):
        protocol.encode(JobDone(1, json.dumps("x" * 2000), 0.0, None), max_size=1024)


@pytest.mark.parametrize(
    "frame",
    [
        protocol.HEADER.pack(3) + b"{x}",
        protocol.HEADER.pack(3) + b"\xff\xfe\x00",
        body([2]),
        body({"v": 1, "type": "Ping", "seq": 1}),  # version 1's objects
        body([1, "Ping", 1]),
        body([True, "Ping", 1]),
        body(["Ping", 1]),
        body([2, "Exec", "rm"]),
        body([2, ["Ping"], 1]),
        body([2, "Ping"]),
        body([2, "Ping", 1, 0]),
        body([2, "Ping", "1"]),
        body([2, "Ping", True]),
        body([2, "Pong", 1, 1.5]),
        body([2, "Returned", None]),
        body([2, "JobFailed", 1, "lease_expired", "", "", 0, None]),
    ],
)
def test_malformed_frames_raise_protocol_error(frame: bytes) -> None:
    with pytest.raises(ProtocolError):
        FrameReader().feed(frame)
    with pytest.raises(ProtocolError):
        protocol.decode(frame)


def test_decode_wants_exactly_one_frame() -> None:
    frame = protocol.encode(Ping(1))
    with pytest.raises(ProtocolError):
        protocol.decode(frame[:-1])
    with pytest.raises(ProtocolError):
        protocol.decode(frame + b"x")


def test_blocking_read_and_write_over_a_socketpair() -> None:
    a, b = socket.socketpair()
    with a, b:
        big = JobDone(1, json.dumps("x" * 1_000_000), 0.1, None)  # > one socket buffer
        for msg in (Ping(1), big):
            pid = os.fork()
            if pid == 0:  # a writer process, so a large frame cannot deadlock the test
                try:
                    protocol.write_frame(b.fileno(), msg)
                finally:
                    os._exit(0)
            assert protocol.read_frame(a.fileno()) == msg
            os.waitpid(pid, 0)
        b.shutdown(socket.SHUT_WR)
        assert protocol.read_frame(a.fileno()) is None  # EOF between frames


def test_read_frame_eof_inside_a_frame_is_a_protocol_error() -> None:
    a, b = socket.socketpair()
    with a, b:
        b.sendall(protocol.encode(Ping(1))[:5])
        b.shutdown(socket.SHUT_WR)
        with pytest.raises(ProtocolError):
            protocol.read_frame(a.fileno())


def test_read_frame_rejects_oversize_before_reading_the_body() -> None:
    a, b = socket.socketpair()
    with a, b:
        b.sendall(protocol.HEADER.pack(protocol.MAX_FRAME + 1))
        with pytest.raises(FrameTooLarge):
            protocol.read_frame(a.fileno())


def test_reader_drains_a_nonblocking_fd() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.setblocking(False)
        reader = FrameReader()
        assert reader.drain(a.fileno()) == ([], False, None)
        b.sendall(protocol.encode(Ready(5)) + protocol.encode(Ping(6)))
        assert reader.drain(a.fileno()) == ([Ready(5), Ping(6)], False, None)
        b.sendall(protocol.encode(Pong(6, None)))
        b.close()
        # the last frames, then EOF
        assert reader.drain(a.fileno()) == ([Pong(6, None)], True, None)


def test_a_bad_frame_keeps_the_frames_before_it_in_the_same_read() -> None:
    done = JobDone(7, '{"ok": true}', 0.25, 4096)
    garbage = protocol.HEADER.pack(5) + b"nope!"
    a, b = socket.socketpair()
    with a, b:
        a.setblocking(False)
        b.sendall(protocol.encode(Pong(1, None)) + protocol.encode(done) + garbage)
        messages, eof, broken = FrameReader().drain(a.fileno())
    assert messages == [Pong(1, None), done]  # the result, then the error
    assert eof and isinstance(broken, ProtocolError)


def test_feed_leaves_the_frames_before_a_bad_one_in_the_list_it_was_given() -> None:
    out: list[protocol.Message] = []
    with pytest.raises(ProtocolError):
        FrameReader().feed(protocol.encode(Ping(3)) + body([2, "Exec", "rm"]), out)
    assert out == [Ping(3)]


def test_a_read_error_keeps_the_frames_read_before_it() -> None:
    # a worker that exits with frames of ours unread resets the connection: the next read
    # after its last frames fails (ECONNRESET) instead of reaching EOF
    a, b = socket.socketpair()
    with a, b:
        a.setblocking(False)
        b.setblocking(False)
        a.sendall(protocol.encode(Ping(2)))  # left unread in b
        b.sendall(protocol.encode(Pong(2, None)))
        b.close()
        messages, eof, broken = FrameReader().drain(a.fileno(), bufsize=16)
    assert messages == [Pong(2, None)] and eof
    assert isinstance(broken, ConnectionResetError)


def test_exit_codes_are_distinct_and_named() -> None:
    codes = [
        exitcodes.OK,
        exitcodes.UNCAUGHT,
        exitcodes.PARENT_GONE,
        exitcodes.PROTOCOL_ERROR,
        exitcodes.SETUP_FAILED,
        exitcodes.RECYCLE,
        exitcodes.INTERNAL_ERROR,
    ]
    assert len(set(codes)) == len(codes) and all(0 <= c < 128 for c in codes)
    assert exitcodes.name(exitcodes.RECYCLE) == "RECYCLE" and exitcodes.name(3) is None
