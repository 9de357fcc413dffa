"""Prometheus export of the kernel probes: a ``prometheus_client`` Collector that reads the maps per scrape.

    registry.register(KernelCollector(probes.snapshot, syscalls=True))

Every label combination of the closed sets is exported from the first scrape on (zeros until something is
counted), so ``rate()`` over a series that appears late never reads as missing.
"""

from __future__ import annotations

from typing import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from probes.stats import TCP_STATE_LABELS, KernelSnapshot, Log2Histogram
from telemetry.metrics import KERNEL_METRICS, KERNEL_STAGES, OFFCPU_REASONS, SYSCALL_FAMILIES

HELP = {
    "runqueue": "Time a thread of the service waited for a CPU (woken or preempted until it ran), by RAG stage.",
    "offcpu": "Time a thread of the service spent off the CPU, from leaving it until running again, by RAG stage "
              "and why it left (preempted, blocked, uninterruptible).",
    "syscall": "Time a system call of the service took from entry to exit, by RAG stage and system-call family.",
    "tcp_retransmits": "TCP segments retransmitted on the service's connections, by TCP state.",
}


def _histogram(family: HistogramMetricFamily, labels: list[str], hist: Log2Histogram | None) -> None:
    hist = hist or Log2Histogram()
    buckets = [(floatToGoString(edge), count) for edge, count in hist.cumulative_buckets()]
    family.add_metric(labels, buckets, hist.sum_seconds)


class KernelCollector:
    """Turns ``read()`` (a ``KernelSnapshot``) into metric families at scrape time.

    ``scheduler``/``syscalls``/``tcp_retransmits`` say which probes run, so that a probe that is off exports
    nothing rather than zeros that would read as "measured, nothing happened"."""

    def __init__(self, read: Callable[[], KernelSnapshot], scheduler: bool = True, syscalls: bool = False,
                 tcp_retransmits: bool = True) -> None:
        self._read = read
        self.scheduler, self.syscalls, self.tcp_retransmits = scheduler, syscalls, tcp_retransmits

    def describe(self) -> list[Metric]:
        """Names only (no map read), so registering the collector costs nothing."""
        return list(self._families(None))

    def collect(self) -> Iterator[Metric]:
        yield from self._families(self._read())

    def _families(self, snap: KernelSnapshot | None) -> Iterator[Metric]:
        if self.scheduler:
            runqueue = HistogramMetricFamily(KERNEL_METRICS["runqueue"], HELP["runqueue"], labels=["stage"])
            offcpu = HistogramMetricFamily(KERNEL_METRICS["offcpu"], HELP["offcpu"], labels=["stage", "reason"])
            if snap is not None:
                for stage in KERNEL_STAGES:
                    _histogram(runqueue, [stage], snap.runqueue.get(stage))
                    for reason in OFFCPU_REASONS:
                        _histogram(offcpu, [stage, reason], snap.offcpu.get((stage, reason)))
            yield runqueue
            yield offcpu
        if self.syscalls:
            syscall = HistogramMetricFamily(KERNEL_METRICS["syscall"], HELP["syscall"], labels=["stage", "family"])
            if snap is not None:
                for stage in KERNEL_STAGES:
                    for family in SYSCALL_FAMILIES:
                        _histogram(syscall, [stage, family], snap.syscall.get((stage, family)))
            yield syscall
        if self.tcp_retransmits:
            retransmits = CounterMetricFamily(KERNEL_METRICS["tcp_retransmits"], HELP["tcp_retransmits"],
                                              labels=["state"])
            if snap is not None:
                for state in TCP_STATE_LABELS:
                    retransmits.add_metric([state], snap.tcp_retransmits.get(state, 0))
            yield retransmits
