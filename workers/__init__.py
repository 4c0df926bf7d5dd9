"""fleetd's child side. Handlers use ``from workers import current_job, Permanent``.

This package never imports ``supervisor`` (or sqlalchemy, prometheus_client, rich, click): it
runs inside forked workers and must stay small and free of the parent's machinery.
"""

from workers.context import JobContext, current_job
from workers.errors import Permanent, SoftTimeout

__all__ = ["JobContext", "Permanent", "SoftTimeout", "current_job"]
