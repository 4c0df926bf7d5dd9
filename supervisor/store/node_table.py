"""The node table's verbs (``NodeTable``, a mixin of ``SqlStore``, as ``ControlTable`` is):
a supervisor registers itself at boot, refreshes its heartbeat and status snapshot, and
``fleetd status`` lists every node with the age of its last heartbeat by the store's clock.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, delete, insert, select, update
from sqlalchemy.sql.elements import ColumnElement

from supervisor.store.schema import nodes


class NodeTable:
    """Node verbs for ``SqlStore``."""

    if TYPE_CHECKING:  # provided by SqlStore

        def _tx(self) -> AbstractContextManager[Connection]: ...
        def _auto(self) -> AbstractContextManager[Connection]: ...
        def _exec(
            self, conn: Connection, stmt: Any, params: dict[str, Any] | None = None
        ) -> Any: ...
        def _now(self) -> ColumnElement[float]: ...

    def register_node(self, *, node_id: str, hostname: str, pid: int, fleet: str) -> None:
        """Record this supervisor as running (replacing an earlier row of the same id)."""
        now = self._now()
        with self._tx() as conn:
            conn.execute(delete(nodes).where(nodes.c.node_id == node_id))
            self._exec(
                conn,
                insert(nodes).values(
                    node_id=node_id,
                    hostname=hostname,
                    pid=pid,
                    fleet=fleet,
                    started_at=now,
                    heartbeat_at=now,
                    state="running",
                ),
            )

    def node_heartbeat(self, node_id: str, *, state: str, snapshot: str | None) -> None:
        """Refresh this node's heartbeat, state and status snapshot."""
        stmt = (
            update(nodes)
            .where(nodes.c.node_id == node_id)
            .values(heartbeat_at=self._now(), state=state, snapshot=snapshot)
        )
        with self._auto() as conn:
            self._exec(conn, stmt)

    def list_nodes(self) -> list[dict[str, Any]]:
        """Every node row, with ``age``: seconds since its last heartbeat (by the store's clock)."""
        query = select(nodes, (self._now() - nodes.c.heartbeat_at).label("age")).order_by(
            nodes.c.node_id
        )
        with self._auto() as conn:
            return [dict(r._mapping) for r in self._exec(conn, query)]
