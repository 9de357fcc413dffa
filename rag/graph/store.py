"""Graph stores: which backend serves an index, and the supervisor that keeps a store's outage from failing requests.

Backends (both ``rag.protocols.GraphStore``, running the same Cypher of ``rag.graph.cypher``):
``rag.graph.falkordb.FalkorDBStore`` (default, embedded: a child process on a unix socket, its file inside the
index generation) and ``rag.graph.neo4j.Neo4jStore`` (a Neo4j server over Bolt, e.g. compose's ``neo4j``).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any, Mapping

from rag.graph.errors import GraphStoreTimeout, GraphStoreUnavailable
from rag.protocols import GraphStore
from rag.settings import GraphSettings

__all__ = ["GraphStoreTimeout", "GraphStoreUnavailable", "SupervisedStore", "open_store"]
log = logging.getLogger("ragheat.graph")

RESTART_BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
# A store that is alive but late is restarted only when it stays late: one slow answer on a busy host is skipped
# for that query alone, while a hung store (alive, answering nothing) is restarted after this many in a row. In a
# row: each late query started after the previous late answer came, so queries late together count once.
RESTART_AFTER_TIMEOUTS = 3


def open_store(settings: GraphSettings, folder: Path, *, persist: bool = False) -> GraphStore:
    """The store ``settings.backend`` names, not yet started (``warm_up()`` starts or connects it). ``folder`` is the
    index generation: the embedded store keeps its file there (``persist``: an ingest writing it)."""
    if settings.backend == "neo4j":
        from rag.graph.neo4j import Neo4jStore

        return Neo4jStore(settings.uri, settings.user, settings.password.get_secret_value(), settings.database,
                          timeout_ms=settings.timeout_ms)
    from rag.graph.falkordb import FalkorDBStore

    return FalkorDBStore(folder, persist=persist, threads=settings.store_threads, timeout_ms=settings.timeout_ms)


class SupervisedStore:
    """A ``GraphStore`` whose outage is answered fast and repaired in the background: while the store is known to be
    down, ``run`` raises ``GraphStoreUnavailable`` at once (no waiting on a dead socket); the first failure starts
    one restarter thread that retries ``restart()`` with backoff until it works or ``close()`` is called. A store
    that answers late but is alive is restarted only after ``RESTART_AFTER_TIMEOUTS`` late answers in a row.
    ``errors``, ``timeouts`` and ``restarts`` count what happened, for ``/readyz`` and tests."""

    def __init__(self, store: GraphStore) -> None:
        self.store = store
        self.name = store.name
        self.errors = 0
        self.timeouts = 0
        self.restarts = 0
        self._late_in_a_row = 0
        self._last_late = float("-inf")  # when the latest late answer came (time.monotonic())
        self._lock = threading.Lock()
        self._restarting: threading.Thread | None = None
        self._closed = threading.Event()

    def warm_up(self) -> None:
        self.store.warm_up()

    def run(self, cypher: str, params: Mapping[str, Any] | None = None, *, write: bool = False) -> list[tuple]:
        if self._restarting is not None:
            raise GraphStoreUnavailable(f"the {self.name} graph store is restarting")
        started = time.monotonic()
        try:
            rows = self.store.run(cypher, params, write=write)
        except GraphStoreTimeout:
            with self._lock:
                self.errors += 1
                self.timeouts += 1
                if started >= self._last_late:
                    self._late_in_a_row += 1
                self._last_late = time.monotonic()
                stays_late = self._late_in_a_row >= RESTART_AFTER_TIMEOUTS
            if stays_late or not self.store.healthy():
                self.restart()
            raise
        except GraphStoreUnavailable:
            self.errors += 1
            self.restart()
            raise
        if self._late_in_a_row and started >= self._last_late:  # asked after the latest late answer: in time again
            with self._lock:
                if started >= self._last_late:
                    self._late_in_a_row = 0
        return rows

    def healthy(self) -> bool:
        """Up and not restarting; a store found dead here (its process gone) starts being restarted."""
        if self._restarting is not None:
            return False
        if self.store.healthy():
            return True
        self.restart()
        return False

    def restart(self) -> None:
        """Start the background restart, unless one is running (returns at once)."""
        with self._lock:
            if self._restarting is not None or self._closed.is_set():
                return
            self._restarting = threading.Thread(target=self._restart_loop, name="graph-store-restart", daemon=True)
            self._restarting.start()

    def _restart_loop(self) -> None:
        attempt = 0
        try:
            while not self._closed.is_set():
                try:
                    self.store.restart()
                    self.restarts += 1
                    with self._lock:
                        self._late_in_a_row = 0
                    log.warning("the %s graph store is back after %d attempt(s)", self.name, attempt + 1)
                    return
                except Exception as exc:  # noqa: BLE001 - keep trying: the service stays up meanwhile
                    log.warning("restarting the %s graph store failed: %s", self.name, exc)
                    self._closed.wait(RESTART_BACKOFF_S[min(attempt, len(RESTART_BACKOFF_S) - 1)])
                    attempt += 1
        finally:
            with self._lock:
                self._restarting = None

    def wait_until_healthy(self, timeout_s: float) -> bool:
        """For tests and start-up checks: True once the store answers and no restart is running."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._restarting is None and self.store.healthy():
                return True
            time.sleep(0.02)
        return False

    def close(self) -> None:
        self._closed.set()
        thread = self._restarting
        if thread is not None:
            thread.join(timeout=30)
        self.store.close()
