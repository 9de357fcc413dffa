"""CPU time per answer: what the service's processes and the load generator spent during a step's measured window,
over the queries answered in it.

A knee says how many answers per second met the SLO; the CPU each answer cost says why it is there and not higher:
with ``n`` usable cores shared by the service and the generator, no queueing policy can answer more than
``n / (service + generator CPU seconds per answer)`` queries per second. Past the knee the cost of refusing the shed
queries is part of each answer's, as it is part of what the cores spend; below it nothing is shed and the two agree.
``ragheat bench --server-pid`` reads the service's processes (and their descendants: ``--workers`` children) from
``/proc``, so the service must run on this machine; the generator is this process (``time.process_time``, all its
threads).

>>> window = CpuWindow([server_pid]); window.start(); ...; window.stop(); window.per_answer(answered)
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Iterable

from telemetry.host import descendants, read_process, read_processes


def process_tree(roots: Iterable[int]) -> set[int]:
    """``roots`` and every live descendant of theirs."""
    return descendants(read_processes() or {}, roots)


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of one process (all its threads); None once it is gone."""
    process = read_process(pid)
    return None if process is None else process.own_s


def cpu_seconds_by_process(roots: Iterable[int]) -> dict[int, float]:
    """User + system CPU seconds of each process (all its threads) in the tree under ``roots``."""
    processes = read_processes() or {}
    return {pid: processes[pid].own_s for pid in descendants(processes, roots)}


class CpuWindow:
    """CPU seconds spent between ``start()`` and ``stop()`` by the service's process tree and by this process.

    A service process that exits inside the window takes its time with it (its parent has not waited for it), so a
    window over a restart undercounts; one that starts inside it counts whole."""

    def __init__(self, server_pids: Iterable[int]) -> None:
        self.server_pids = tuple(int(p) for p in server_pids)
        missing = [p for p in self.server_pids if not Path(f"/proc/{p}/stat").exists()]
        if not self.server_pids or missing:
            raise ValueError(f"no process {', '.join(map(str, missing or ['(none given)']))} on this machine: the "
                             "service's CPU is read from /proc, so it must run here (or leave --server-pid out)")
        self._server0: dict[int, float] | None = None
        self._own0 = 0.0
        self.service_s: float | None = None
        self.generator_s: float | None = None

    def start(self) -> None:
        self._server0 = cpu_seconds_by_process(self.server_pids)
        self._own0 = time.process_time()

    @property
    def started(self) -> bool:
        return self._server0 is not None

    def stop(self) -> None:
        if self._server0 is None:
            raise RuntimeError("CpuWindow.stop() before start()")
        own = time.process_time() - self._own0
        now = cpu_seconds_by_process(self.server_pids)
        self.service_s = sum(seconds - self._server0.get(pid, 0.0) for pid, seconds in now.items())
        self.generator_s = own

    def per_answer(self, answers: int) -> dict:
        """CPU ms per answer of the service and of the generator over the ``answers`` given in the window, and the
        answers per second their sum lets this process's usable cores hold; empty when the window never closed or
        saw no answer."""
        if self.service_s is None or answers <= 0:
            return {}
        service_ms, generator_ms = self.service_s * 1000 / answers, self.generator_s * 1000 / answers
        cores = len(os.sched_getaffinity(0))
        total = service_ms + generator_ms
        return {"service": service_ms, "generator": generator_ms, "answers": answers, "cores": cores,
                "ceiling_qps": cores * 1000 / total if total > 0 else None}
