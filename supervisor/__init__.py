"""fleetd's parent side: config, store, client, CLI and the supervisor loop.

``from supervisor import Client`` is the public API; nothing runs at import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["Client", "__version__"]

if TYPE_CHECKING:
    from supervisor.client import Client


def __getattr__(name: str) -> Any:
    # Lazy, so that `import supervisor` stays cheap for the CLI's --help and for workers.
    if name == "Client":
        from supervisor.client import Client

        return Client
    raise AttributeError(name)
