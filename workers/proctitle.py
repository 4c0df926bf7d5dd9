"""Worker process titles, as ``ps`` and ``top`` show them::

    fleetd: bulk#3 idle
    fleetd: bulk#3 job=1234 render 12s

The formatting is pure; ``set_title`` is the one call with an effect. The busy title is set when
a job starts: the handler runs in the main thread, so nothing updates the seconds while it runs.
"""

from __future__ import annotations

try:
    import setproctitle as _setproctitle
except ImportError:  # a title is a convenience: without the package the worker still runs
    _setproctitle = None  # type: ignore[assignment]


def title_idle(pool: str, slot: int) -> str:
    """``fleetd: bulk#3 idle``."""
    return f"fleetd: {pool}#{slot} idle"


def title_busy(pool: str, slot: int, job_id: int, kind: str, elapsed_s: float) -> str:
    """``fleetd: bulk#3 job=1234 render 12s`` (elapsed seconds rounded down)."""
    return f"fleetd: {pool}#{slot} job={job_id} {kind} {int(elapsed_s)}s"


def set_title(title: str) -> bool:
    """Set this process's title; False when setproctitle is not installed."""
    if _setproctitle is None:
        return False
    _setproctitle.setproctitle(title)
    return True
