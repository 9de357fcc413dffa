"""The graph's own error, apart so every store module can raise it without importing the others."""

from __future__ import annotations

from rag.errors import RagheatError


class GraphStoreUnavailable(RagheatError):
    """The graph store cannot answer right now (stopped, killed, restarting, unreachable or too slow)."""


class GraphStoreTimeout(GraphStoreUnavailable):
    """The graph store is up but answered later than ``graph.timeout_ms`` (busy host, heavy query)."""
