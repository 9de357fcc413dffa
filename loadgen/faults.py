"""Constant load and the faults injected under it, for the drills that check what ``ragheat explain`` says: an
open-loop sender whose rate can change while it runs (overload is the same sender, faster) and processes spinning on
the host's cores (a neighbour taking the CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx


def wait_until(unix_time: float) -> None:
    """Sleep until a wall-clock instant (now if it has passed): the drills' phases are instants Prometheus also
    reads."""
    time.sleep(max(0.0, unix_time - time.time()))


class OpenLoop:
    """``with OpenLoop(url, rate, queries):`` POSTs ``{"query": ...}`` to ``url/v1/query`` at ``rate`` per second,
    whatever the answers' speed (an open loop: a slow service queues them); ``rate`` may change while it runs."""

    def __init__(self, url: str, rate: float, queries: Path, path: str = "/v1/query", workers: int = 96) -> None:
        self.url, self.rate, self.path = url.rstrip("/"), rate, path
        self.texts = [json.loads(line)["text"] for line in Path(queries).read_text().splitlines() if line.strip()]
        if not self.texts:
            raise ValueError(f"{queries}: no queries")
        self.sent = 0
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="open-loop")
        self._client = httpx.Client(timeout=30, limits=httpx.Limits(max_connections=workers))
        self._thread = threading.Thread(target=self._run, name="open-loop", daemon=True)

    def _ask(self, text: str) -> None:
        try:
            self._client.post(self.url + self.path, json={"query": text})
        except httpx.HTTPError:
            pass  # a refused or timed-out request is the service's signal, counted on its side

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self._pool.submit(self._ask, self.texts[self.sent % len(self.texts)])
            self.sent += 1
            next_at += 1.0 / self.rate
            time.sleep(max(0.0, next_at - time.monotonic()))

    def __enter__(self) -> "OpenLoop":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._pool.shutdown(wait=True)
        self._client.close()


class CpuHog:
    """``with CpuHog(processes):`` that many processes spinning in a loop, each wanting a whole core."""

    def __init__(self, processes: int | None = None) -> None:
        self.processes = processes or os.cpu_count() or 1
        self._children: list[subprocess.Popen] = []

    def __enter__(self) -> "CpuHog":
        self._children = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(self.processes)]
        return self

    def __exit__(self, *exc) -> None:
        for child in self._children:
            child.kill()
            child.wait()
