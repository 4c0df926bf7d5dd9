"""The worker's end of its connection to the parent: frames in, to an inbox, and out.

Frames are acted on in the order the parent sent them. The parent may send several RunJob
frames ahead (it does for pools whose jobs are short: ``supervisor.policy.pipeline_depth``);
they wait in the inbox, and a Release hands back those still there at once, as ``Returned``.
EOF or a read or write error means the parent is gone (exit PARENT_GONE); a bad frame from
it leaves the stream out of step (exit PROTOCOL_ERROR).
"""

from __future__ import annotations

import os
import select
from collections import deque

from workers import exitcodes, protocol
from workers.exiting import WorkerExit


class Connection:
    """One blocking, connected socket or pipe; its reader, its inbox and a poller on it.
    The worker classes extend it (``workers.worker``), so the job loop reaches its methods
    with no lookup more than its own."""

    def __init__(self, conn_fd: int, max_frame: int) -> None:
        self.fd = conn_fd
        self.max_frame = max_frame
        self.reader = protocol.FrameReader(max_frame)
        self.inbox: deque[protocol.Message] = deque()  # received, not yet acted on
        self.poller = select.poll()
        self.poller.register(conn_fd, select.POLLIN)

    def receive(self) -> None:
        """One (blocking) read; its complete frames join the inbox, and a Release hands back
        the jobs waiting there. EOF or a read error means the parent is gone."""
        try:
            data = os.read(self.fd, 65536)
        except OSError as exc:
            raise WorkerExit(exitcodes.PARENT_GONE) from exc
        if not data:
            if self.reader.pending:
                why = f"end of file inside a frame ({self.reader.pending} bytes)"
                raise WorkerExit(exitcodes.PROTOCOL_ERROR, f"bad frame from the parent: {why}")
            raise WorkerExit(exitcodes.PARENT_GONE)
        try:
            messages = self.reader.feed(data)
        except protocol.ProtocolError as exc:
            why = f"bad frame from the parent: {exc}"
            raise WorkerExit(exitcodes.PROTOCOL_ERROR, why) from exc
        for msg in messages:
            if isinstance(msg, protocol.Release):
                self.return_waiting_jobs()
            else:
                self.inbox.append(msg)

    def return_waiting_jobs(self) -> None:
        """Answer a Release: every RunJob in the inbox goes back to the parent, unstarted."""
        jobs = [m for m in self.inbox if isinstance(m, protocol.RunJob)]
        if not jobs:
            return
        rest = [m for m in self.inbox if not isinstance(m, protocol.RunJob)]
        self.inbox = deque(rest)
        frames = b"".join(
            protocol.encode(protocol.Returned(job.job_id), self.max_frame) for job in jobs
        )
        self.send_bytes(frames)

    def send(self, msg: protocol.Message) -> None:
        """Write one frame; a broken pipe means the parent is gone."""
        self.send_bytes(protocol.encode(msg, self.max_frame))

    def send_bytes(self, frame: bytes) -> None:
        """Write an encoded frame, resuming partial writes."""
        view = memoryview(frame)
        try:
            while view:
                view = view[os.write(self.fd, view) :]
        except OSError as exc:
            raise WorkerExit(exitcodes.PARENT_GONE) from exc
