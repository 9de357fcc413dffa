"""Run the app under uvicorn in a background thread on a loopback socket (demo, tests, benchmarks)."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import uvicorn


class BackgroundServer:
    """``with BackgroundServer(app) as url:`` serves ``app`` until the block ends.

    The socket is bound before uvicorn starts (port 0 = a free port), so there is no race
    between choosing a port and listening on it.
    """

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, ready_timeout: float = 120.0) -> None:
        self.app, self.host, self.port, self.ready_timeout = app, host, port, ready_timeout
        self.url = ""

    def __enter__(self) -> str:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        self.url = f"http://{self.host}:{self.port}"
        config = uvicorn.Config(self.app, log_level="warning", access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]},
                                       name="ragheat-uvicorn", daemon=True)
        self.thread.start()
        self._wait_ready()
        return self.url

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if not self.thread.is_alive():
                raise RuntimeError("the server stopped during start-up (see the log above)")
            try:
                if httpx.get(self.url + "/readyz", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"{self.url}/readyz was not ready within {self.ready_timeout} s")

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
