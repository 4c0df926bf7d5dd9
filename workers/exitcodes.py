"""Named exit codes of a worker process, shared with the parent's exit classifier.

=====  ==================  ===========================================================
code   name                meaning
=====  ==================  ===========================================================
0      ``OK``              asked to stop (``Shutdown`` frame) and stopped between jobs
1      ``UNCAUGHT``        Python's own code for an uncaught exception (a runtime bug)
80     ``PARENT_GONE``     the parent is gone: pipe EOF or broken pipe, or the parent pid
                           changed before PR_SET_PDEATHSIG was in place
81     ``PROTOCOL_ERROR``  a frame from the parent could not be decoded
82     ``SETUP_FAILED``    post-fork setup failed (privilege drop, rlimits); the pool should
                           back off instead of fork-looping
83     ``RECYCLE``         planned exit after a ``Recycling`` frame: max_jobs_per_worker
                           reached or RSS stayed above recycle_rss
84     ``INTERNAL_ERROR``  the runtime itself raised; the traceback went to stderr
=====  ==================  ===========================================================

The codes sit above the small numbers handlers and libraries tend to use (``sys.exit(1)``,
``os._exit(3)``) and below 128, where shells report signals. They can still be forged: a
handler may call ``os._exit(83)``. The runtime only exits with these codes between jobs, so the
classifier should trust them only when no job was in flight; a death during a job is a crash
whatever the code.
"""

from __future__ import annotations

OK = 0
UNCAUGHT = 1
PARENT_GONE = 80
PROTOCOL_ERROR = 81
SETUP_FAILED = 82
RECYCLE = 83
INTERNAL_ERROR = 84

_NAMES = {
    OK: "OK",
    UNCAUGHT: "UNCAUGHT",
    PARENT_GONE: "PARENT_GONE",
    PROTOCOL_ERROR: "PROTOCOL_ERROR",
    SETUP_FAILED: "SETUP_FAILED",
    RECYCLE: "RECYCLE",
    INTERNAL_ERROR: "INTERNAL_ERROR",
}


def name(code: int) -> str | None:
    """The name of a worker exit code (``"RECYCLE"``), or None for any other code."""
    return _NAMES.get(code)
