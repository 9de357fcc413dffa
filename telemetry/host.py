"""The machine under the service, read when Prometheus scrapes: CPU time by mode (``/proc/stat``), the kernel's
pressure stall information (``/proc/pressure``) and the service process's own CPU time. ``ragheat explain``
reads them to tell a neighbour taking the CPU from the service's own work, and memory or I/O pressure from a slow
dependency; nothing here is per request, so none of it costs a request anything."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from telemetry.metrics import HOST_CPU_MODES, PRESSURE_RESOURCES, PRESSURE_SCOPES, specs

SPECS = specs("host")
PROC = Path("/proc")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


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
    """User plus system CPU time of this process, every thread."""
    times = os.times()
    return times.user + times.system


class HostCollector(Collector):
    """The ``host`` group of ``METRICS``, computed at each scrape."""

    def __init__(self, proc: Path = PROC) -> None:
        self.proc = proc

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
        process.add_metric([], process_cpu_seconds())
        yield process
