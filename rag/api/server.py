"""Run the service for a while: in a background thread (demo, tests) or as a `ragheat serve` process
(benchmarks), on a loopback port, and wait until it answers."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

import httpx
import uvicorn


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_until_ok(url: str, timeout_s: float, alive: Callable[[], bool], what: str) -> None:
    """Poll ``url`` until it answers 200; fail early, naming ``what``, if ``alive()`` turns false."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError(f"{what} stopped during start-up (see its log)")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{what}: {url} did not answer 200 within {timeout_s} s")


def start_serve_process(index: Path, extra_args: Sequence[str] = (), env: dict | None = None,
                        ready_timeout_s: float = 120.0) -> tuple[subprocess.Popen, str]:
    """``ragheat serve --index INDEX`` on a free port as a child process; returns it and its URL once ready."""
    port = free_port()
    ragheat = Path(sys.executable).parent / "ragheat"
    process = subprocess.Popen([str(ragheat), "serve", "--index", str(index), "--port", str(port),
                                "--log-level", "warning", *extra_args], env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ok(url + "/readyz", ready_timeout_s, lambda: process.poll() is None, "ragheat serve")
    except Exception:
        process.kill()
        raise
    return process, url


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
        wait_until_ok(self.url + "/readyz", self.ready_timeout, self.thread.is_alive, "the server")
        return self.url

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
