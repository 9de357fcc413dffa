"""``ragheat serve --workers N``: N server processes on one port, their metrics aggregated in every scrape.

Each worker is a fresh ``ragheat serve`` process (``--worker i``; not a fork: the model, the index and the telemetry
start clean in each) whose listening socket is bound with ``SO_REUSEPORT``, so the kernel spreads new connections over
the workers. The parent only supervises: it makes an empty ``PROMETHEUS_MULTIPROC_DIR`` before any worker starts
(each worker's ``prometheus_client`` then keeps its values in files there), restarts a worker that dies after
``server.worker_min_uptime_s`` (its counters and histograms stay in the sums; its live gauges, requests in flight, are
dropped: ``mark_process_dead``), stops every worker when one dies sooner (it could not start: the others would not
either) or when it is told to stop, and removes the folder afterwards.

A scrape reaches one worker; that worker answers with a ``MultiProcessCollector`` over the folder, i.e. every worker's
counters and histograms summed, gauges per worker (``pid`` label), plus its own scrape-time collectors.
prometheus_client keeps no exemplars in multiprocess mode; each worker shares its latest ones through the same
folder instead (``telemetry.exemplars``), so an OpenMetrics scrape carries exemplars from every worker. The host
families are read by the answering worker alone: the machine once, and the service's CPU as the whole tree under this
parent (``telemetry.host``), never one worker's.

    supervise(["--index", "data/index/scifact", "--port", "8000"], workers=2)   # returns when stopped
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from rag.api.steering import WORKERS_ENV
from rag.childproc import ChildProcess

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
HIGH_WATER_FILE = "process-cpu-high-water"
"""In the multiprocess folder: the service's CPU counter as last exported by any worker (``telemetry.host``)."""


def worker_socket(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` that the other workers' sockets share (``SO_REUSEPORT``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def worker_argv(argv: Sequence[str]) -> list[str]:
    """``ragheat serve``'s own arguments without ``--workers``, ``--prometheus`` and ``--probes`` (the parent's
    business)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--workers":
            skip = True
            continue
        if arg.startswith("--workers=") or arg in ("--prometheus", "--probes"):
            continue
        out.append(arg)
    return out


def supervise(argv: Sequence[str], workers: int, log_dir: Path | None = None, min_uptime_s: float = 30.0,
              probes: Sequence[str] | None = None, ready_url: str | None = None) -> int:
    """Run ``workers`` ``ragheat serve`` workers with ``argv`` until SIGTERM/SIGINT or until one exits within
    ``min_uptime_s`` of its start (later exits are restarted); returns the exit code (0 when stopped, else that
    worker's). A worker binds the port once its index is loaded, so the kernel sends connections only to workers that
    can answer. ``probes``: a ``ragheat probes --service-url ...`` command line, started once ``ready_url`` answers
    (it finds every worker on the port and follows restarts); its failure never stops the workers."""
    from prometheus_client.multiprocess import mark_process_dead

    folder = Path(tempfile.mkdtemp(prefix="ragheat-metrics-"))
    env = {**os.environ, MULTIPROC_ENV: str(folder), WORKERS_ENV: str(workers)}
    ragheat = str(Path(sys.executable).parent / "ragheat")

    def worker(i: int) -> ChildProcess:
        return ChildProcess(f"worker-{i}", [ragheat, "serve", *worker_argv(argv), "--worker", str(i)], env=env,
                            log_path=None if log_dir is None else log_dir / f"worker-{i}.log",
                            die_with_parent=True, stop_timeout_s=30)

    children = [worker(i) for i in range(1, workers + 1)]
    started: dict[int, float] = {}
    sidecar = None if not probes else ChildProcess("probes", probes, die_with_parent=True, stop_timeout_s=10)
    stopping: dict = {"signal": None}

    def stop(signum, frame) -> None:
        stopping["signal"] = signum

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    code = 0
    try:
        for i, child in enumerate(children):
            child.start()
            started[i] = time.monotonic()
        while stopping["signal"] is None and not code:
            for i, child in enumerate(children):
                if child.alive() or stopping["signal"] is not None:
                    continue
                returned = child.process.returncode
                uptime = time.monotonic() - started[i]
                if uptime < min_uptime_s:
                    code = returned or 1
                    print(f"ragheat serve: {child.name} exited with code {returned} {uptime:.0f} s after its start "
                          f"(under server.worker_min_uptime_s = {min_uptime_s:g} s: it could not start); stopping "
                          "the other workers", file=sys.stderr)
                    break
                mark_process_dead(child.pid, str(folder))
                print(f"ragheat serve: {child.name} (pid {child.pid}) exited with code {returned} after "
                      f"{uptime:.0f} s; restarting it", file=sys.stderr)
                children[i] = worker(i + 1)
                children[i].start()
                started[i] = time.monotonic()
            if sidecar is not None:
                sidecar = _tend_probes(sidecar, ready_url)
            time.sleep(0.2)
    finally:
        for child in children + ([sidecar] if sidecar is not None and sidecar.process is not None else []):
            child.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)
        shutil.rmtree(folder, ignore_errors=True)
    return code


def _tend_probes(sidecar: ChildProcess, ready_url: str | None) -> ChildProcess | None:
    """Start the probes once the service answers; None (and a line) once they have exited: the workers serve on."""
    if sidecar.process is None:
        if ready_url is None or _answers(ready_url):
            sidecar.start()
        return sidecar
    if sidecar.alive():
        return sidecar
    print(f"ragheat serve: the kernel probes exited with code {sidecar.process.returncode}; serving without them",
          file=sys.stderr)
    return None


def _answers(url: str) -> bool:
    import httpx

    try:
        return httpx.get(url, timeout=0.5).status_code == 200
    except httpx.HTTPError:
        return False


class ScrapeRegistry:
    """What a worker's ``/metrics`` serves: every worker's values from the multiprocess folder (counters and histograms
    summed, gauges one series per worker with a ``pid`` label), plus what this worker computes at scrape time: its
    collectors that are not plain metric objects (probes, the engine's folder) and its gauges read through a function
    (``set_function``: the qps window, the answer cache's size), which report this worker alone."""

    def __init__(self, registry, folder: str) -> None:
        from prometheus_client import CollectorRegistry
        from prometheus_client.metrics import Gauge, MetricWrapperBase
        from prometheus_client.multiprocess import MultiProcessCollector

        from telemetry.exemplars import WithExemplars

        self.registry = CollectorRegistry(auto_describe=False)
        # prometheus_client has no public list of a registry's collectors; this map is what ``unregister`` uses.
        collectors = list(registry._collector_to_names)
        functions = [c for c in collectors if isinstance(c, Gauge) and "_child_samples" in vars(c)]
        own = [c for c in collectors if not isinstance(c, MetricWrapperBase)] + functions
        summed = WithExemplars(MultiProcessCollector(None, path=folder), folder)
        self.registry.register(_Without(summed, {g._name for g in functions}))
        for collector in own:
            self.registry.register(collector)


class _Without:
    """A collector's families except ``names`` (served by this worker's own function gauges instead: one family
    must not appear twice in a scrape)."""

    def __init__(self, inner, names: set[str]) -> None:
        self.inner, self.names = inner, names

    def collect(self):
        return (family for family in self.inner.collect() if family.name not in self.names)
