"""``GraphStore`` on a Neo4j server over Bolt, with the official ``neo4j`` driver (compose's ``neo4j`` service;
``graph.backend=neo4j``). The same parameterised Cypher as the embedded store (``rag.graph.cypher``); each index
generation's nodes carry their generation, so an ingest loads the new one beside the served one and removes the
old ones after the swap.

The tests run this backend against FalkorDB's own Bolt listener (``rag.graph.falkordb``, tests only), which serves
only the graph key ``falkordb`` whatever database is named.
"""

from __future__ import annotations

import threading
from typing import Any, Mapping

from rag.graph.errors import GraphStoreTimeout, GraphStoreUnavailable

CONNECT_ATTEMPTS = 3


class Neo4jStore:
    """The ``neo4j`` driver against ``uri``. ``timeout_ms`` bounds each query (and connecting); a server that cannot
    be reached raises ``GraphStoreUnavailable``; ``restart()`` makes a new driver (the server is not ours to
    restart)."""

    name = "neo4j"

    def __init__(self, uri: str, user: str, password: str, database: str | None = None, *,
                 timeout_ms: int = 1000) -> None:
        self.uri, self.database, self.timeout_ms = uri, database, timeout_ms
        self._auth = (user, password)
        self._driver = None
        self._ok = False
        self._lock = threading.Lock()

    def warm_up(self) -> None:
        with self._lock:
            if self._driver is None:
                self._connect()

    def _connect(self) -> None:
        import neo4j
        from neo4j.exceptions import AuthError, DriverError, ServiceUnavailable

        seconds = self.timeout_ms / 1000
        for attempt in range(CONNECT_ATTEMPTS):  # a handshake lost once is not an outage
            driver = neo4j.GraphDatabase.driver(self.uri, auth=self._auth, connection_timeout=seconds,
                                                connection_acquisition_timeout=seconds, max_transaction_retry_time=0)
            try:
                driver.verify_connectivity()
            except (ServiceUnavailable, AuthError, DriverError, OSError) as exc:
                driver.close()
                self._ok = False
                if isinstance(exc, AuthError) or attempt == CONNECT_ATTEMPTS - 1:
                    raise GraphStoreUnavailable(f"the neo4j graph store at {self.uri} cannot be reached: "
                                                f"{type(exc).__name__}: {exc}") from exc
            else:
                self._driver, self._ok = driver, True
                return

    def run(self, cypher: str, params: Mapping[str, Any] | None = None, *, write: bool = False) -> list[tuple]:
        import neo4j
        from neo4j.exceptions import ClientError, ServiceUnavailable, SessionExpired, TransientError

        driver = self._driver
        if driver is None:
            raise GraphStoreUnavailable(f"the neo4j graph store at {self.uri} is not connected")
        # Loads may take longer than a query should: only reads are bounded by timeout_ms.
        query = neo4j.Query(cypher, timeout=None if write else self.timeout_ms / 1000)
        try:
            records, _, _ = driver.execute_query(
                query, dict(params or {}), database_=self.database,
                routing_=neo4j.RoutingControl.WRITE if write else neo4j.RoutingControl.READ)
        except (ServiceUnavailable, SessionExpired, OSError) as exc:
            self._ok = False
            raise GraphStoreUnavailable(f"the neo4j graph store at {self.uri} did not answer: "
                                        f"{type(exc).__name__}: {exc}") from exc
        except (TransientError, ClientError) as exc:
            if "Timeout" in (exc.code or "") or "TimedOut" in (exc.code or ""):  # the query's own limit: late, alive
                raise GraphStoreTimeout(f"the neo4j graph store at {self.uri} answered late: {exc}") from exc
            if isinstance(exc, TransientError):  # overloaded, deadlocked, out of memory: unavailable for now
                raise GraphStoreUnavailable(f"the neo4j graph store at {self.uri}: {exc}") from exc
            raise
        self._ok = True
        return [tuple(record.values()) for record in records]

    def healthy(self) -> bool:
        return self._driver is not None and self._ok

    def restart(self) -> None:
        with self._lock:
            self._close()
            self._connect()

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._driver is not None:
            self._driver.close()
            self._driver = None
