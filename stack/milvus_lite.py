"""A Milvus server on loopback for ``vector_store.backend=milvus`` where no Milvus runs: ``milvus-lite``'s gRPC server
(the PyPI package ``milvus-lite``, installed with ragheat), which speaks Milvus' protocol to the same ``pymilvus``
client a Milvus cluster answers. Its data lives in a folder of its own. The tests and the Milvus benchmark start
their own (docs/scale.md).

    >>> with MilvusLiteServer(folder) as server:
    ...     settings = VectorStoreSettings(backend="milvus", uri=server.uri)
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from rag.childproc import ChildProcess, free_port
from rag.errors import ConfigurationError

BINARY = "milvus-lite"


def milvus_lite_binary() -> str:
    """The ``milvus-lite`` command beside this Python, or on PATH; ``ConfigurationError`` naming the package."""
    beside = Path(sys.executable).parent / BINARY
    binary = str(beside) if beside.is_file() else shutil.which(BINARY)
    if binary is None:
        raise ConfigurationError("the milvus-lite server was not found: install the PyPI package 'milvus-lite' "
                                 "(scripts/install.sh does), or point vector_store.uri at a Milvus server")
    return binary


class MilvusLiteServer:
    """``milvus-lite server`` on ``127.0.0.1`` and a free port, its data in ``folder``; ``uri`` once started."""

    def __init__(self, folder: Path, port: int | None = None, workers: int = 4) -> None:
        self.folder, self.port = Path(folder), port or free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.child = ChildProcess("milvus-lite", [milvus_lite_binary(), "server", "--data-dir", self.folder / "data",
                                                  "--host", "127.0.0.1", "--port", str(self.port),
                                                  "--max-workers", str(workers)],
                                  log_path=self.folder / "milvus-lite.log", die_with_parent=True)

    def start(self, timeout_s: float = 60.0) -> "MilvusLiteServer":
        """Start it and return once it answers a request (``TimeoutError``/``RuntimeError`` with its log's end)."""
        from pymilvus import MilvusClient

        self.folder.mkdir(parents=True, exist_ok=True)
        self.child.start()
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.child.alive():
                raise RuntimeError(f"milvus-lite exited during start-up (log {self.child.log_path}):\n"
                                   f"{self.child.log_tail()}")
            try:
                client = MilvusClient(uri=self.uri, timeout=1.0)
                client.list_collections()
                client.close()
                return self
            except Exception:  # noqa: BLE001 - not listening yet
                if time.monotonic() > deadline:
                    self.child.stop()
                    raise TimeoutError(f"milvus-lite did not answer at {self.uri} within {timeout_s:g} s (log "
                                       f"{self.child.log_path})") from None
                time.sleep(0.1)

    def stop(self) -> None:
        self.child.stop()

    def __enter__(self) -> "MilvusLiteServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
