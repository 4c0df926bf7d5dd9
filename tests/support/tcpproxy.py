"""The TCP proxy tests take a database away with (it lives in stress/: the chaos harness stalls
PostgreSQL with it too)."""

from stress.tcpproxy import TcpProxy

__all__ = ["TcpProxy"]
