"""The machine under the service, read when Prometheus scrapes: CPU time by mode (``/proc/stat``), the kernel's
pressure stall information (``/proc/pressure``) and the service's own CPU time. ``ragheat explain`` reads them to
tell a neighbour taking the CPU from the service's own work, and memory or I/O pressure from a slow dependency;
nothing here is per request, so none of it costs a request anything.

The service's CPU is a process tree: the process that serves (``ragheat serve --workers N``: the supervisor, whose
children the workers are) and everything it started, since the service starts those for its own work (the embedded
graph store, vLLM's engine core, the kernel probes' exporter). Only a Prometheus it runs for the operator
(``--prometheus``) is left out: scraping is not the service's work. Processes already gone count too: the kernel
adds a reaped child's time to its parent's."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from telemetry.metrics import HOST_CPU_MODES, PRESSURE_RESOURCES, PRESSURE_SCOPES, specs

SPECS = specs("host")
PROC = Path("/proc")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
LEFT_OUT = frozenset({"prometheus"})
"""Executables (``/proc/PID/comm``) under the service that are not its work: their processes and children are
skipped."""


def host_cpu_seconds(proc: Path = PROC) -> dict[str, float]:
    """Seconds of CPU time the whole machine spent in each mode since boot, summed over its CPUs."""
    fields = (proc / "stat").read_text().splitlines()[0].split()[1:]
    return {mode: int(value) / CLOCK_TICKS for mode, value in zip(HOST_CPU_MODES, fields)}


def pressure_stalled_seconds(proc: Path = PROC) -> dict[tuple[str, str], float]:
    """(resource, scope) -> seconds some (or all) runnable tasks stalled on it since boot; empty for a resource
    the kernel does not report (PSI off, or an older kernel)."""
    stalled = {}
    for resource in PRESSURE_RESOURCES:
        try:
            lines = (proc / "pressure" / resource).read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            scope, *pairs = line.split()
            total = dict(pair.split("=", 1) for pair in pairs).get("total")
            if scope in PRESSURE_SCOPES and total is not None:
                stalled[(resource, scope)] = int(total) / 1e6  # microseconds
    return stalled


def process_cpu_seconds() -> float:
    """User plus system CPU time of this process, every thread, and of its children it has waited for."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


@dataclass(frozen=True)
class ProcessTimes:
    """One process as ``/proc/PID/stat`` shows it: its parent, its executable's name, the CPU seconds of all its
    threads (user plus system) and those of the children it has reaped."""

    ppid: int
    comm: str
    own_s: float
    reaped_s: float


def read_process(pid: int, proc: Path = PROC) -> ProcessTimes | None:
    """Process ``pid`` from ``proc``; None once it is gone (or was never there)."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as file:
            text = file.read().decode(errors="replace")
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces or parentheses, so it ends at the last ")".
    comm, fields = text[text.find("(") + 1:text.rfind(")")], text[text.rfind(")") + 2:].split()
    utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
    return ProcessTimes(int(fields[1]), comm, (utime + stime) / CLOCK_TICKS, (cutime + cstime) / CLOCK_TICKS)


def read_processes(proc: Path = PROC) -> dict[int, ProcessTimes] | None:
    """Every process in ``proc`` by pid; None without a readable ``proc``."""
    try:
        entries = os.listdir(proc)
    except OSError:
        return None
    # A process gone since the listing is left out.
    return {int(entry): process for entry in entries
            if entry.isdigit() and (process := read_process(int(entry), proc)) is not None}


def descendants(processes: dict[int, ProcessTimes], roots: Iterable[int],
                left_out: frozenset[str] = frozenset()) -> set[int]:
    """``roots`` that are in ``processes`` and every process under them; the subtrees of ``left_out`` executables
    below a root skipped."""
    children: dict[int, list[int]] = {}
    for pid, process in processes.items():
        children.setdefault(process.ppid, []).append(pid)
    tree, todo = set(), [(pid, True) for pid in roots if pid in processes]
    while todo:
        pid, is_root = todo.pop()
        if pid in tree or (not is_root and processes[pid].comm in left_out):
            continue
        tree.add(pid)
        todo += [(child, False) for child in children.get(pid, ())]
    return tree


def tree_cpu_seconds(root: int, proc: Path = PROC, left_out: frozenset[str] = LEFT_OUT) -> float | None:
    """User plus system CPU time of process ``root`` and of every process under it, every thread, plus what each of
    them reaped from its children; the subtrees of ``left_out`` executables skipped. None when ``root`` is not in
    ``proc`` (no /proc, or the process is gone)."""
    processes = read_processes(proc)
    if processes is None or root not in processes:
        return None
    return sum(processes[pid].own_s + processes[pid].reaped_s for pid in descendants(processes, [root], left_out))


class HighWater:
    """The largest value a counter has been exported with, so that it never steps back: Prometheus would read a
    step back as a counter reset and its rate as a burst. A tree's sum can step back: a process orphaned by its
    parent's death leaves the tree with its time, and a child reaped during a scrape's reads is missed by both.
    ``path``: one file shared by the processes that take turns answering scrapes (the workers); None: this one's."""

    def __init__(self, path: Path | None = None) -> None:
        self.path, self.value, self._lock = path, 0.0, threading.Lock()

    def __call__(self, value: float) -> float:
        with self._lock:
            if self.path is None:
                self.value = max(self.value, value)
                return self.value
            import fcntl  # POSIX only: the shared file serves `ragheat serve --workers N`

            with open(self.path, "a+") as file:
                fcntl.flock(file, fcntl.LOCK_EX)  # released on close
                file.seek(0)
                try:
                    value = max(float(file.read() or 0.0), value)
                except ValueError:  # a torn write cannot happen under the lock; any other junk is replaced
                    pass
                file.seek(0)
                file.truncate()
                file.write(repr(value))
            return value


class HostCollector(Collector):
    """The ``host`` group of ``METRICS``, computed at each scrape. ``root``: the service's top process (None: this
    one, read at each scrape, so that a process forked after this was built reports its own tree)."""

    def __init__(self, proc: Path = PROC, root: int | None = None) -> None:
        self.proc, self.root = proc, root
        self.high_water, self._high_water_root = HighWater(), root

    def share_high_water(self, path: Path) -> None:
        """Keep the service's CPU counter monotonic together with the other processes that answer its scrapes in
        turn, through the file ``path``."""
        self.high_water = HighWater(path)

    def service_cpu_seconds(self) -> float:
        root = os.getpid() if self.root is None else self.root
        if root != self._high_water_root and self.high_water.path is None:  # a forked child: its own counter
            self.high_water, self._high_water_root = HighWater(), root
        seconds = tree_cpu_seconds(root, self.proc)
        if seconds is None:  # no /proc (not Linux): this process and its reaped children
            seconds = process_cpu_seconds()
        return self.high_water(seconds)

    def collect(self) -> Iterator[CounterMetricFamily]:
        cpu_spec, pressure_spec, process_spec = SPECS["host_cpu"], SPECS["pressure"], SPECS["process_cpu"]
        cpu = CounterMetricFamily(cpu_spec.base_name, cpu_spec.help, labels=cpu_spec.labels)
        try:
            for mode, seconds in host_cpu_seconds(self.proc).items():
                cpu.add_metric([mode], seconds)
        except OSError:  # no /proc: the family stays, empty
            pass
        yield cpu
        pressure = CounterMetricFamily(pressure_spec.base_name, pressure_spec.help, labels=pressure_spec.labels)
        for (resource, scope), seconds in pressure_stalled_seconds(self.proc).items():
            pressure.add_metric([resource, scope], seconds)
        yield pressure
        process = CounterMetricFamily(process_spec.base_name, process_spec.help)
        process.add_metric([], self.service_cpu_seconds())
        yield process
