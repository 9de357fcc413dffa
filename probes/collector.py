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
from telemetry.metrics import KERNEL_STAGES, OFFCPU_REASONS, SYSCALL_FAMILIES, MetricSpec, specs

SPECS = specs("kernel")


def _family(kind, spec: MetricSpec) -> Metric:
    return kind(spec.base_name, spec.help, labels=list(spec.labels))


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
            runqueue = _family(HistogramMetricFamily, SPECS["runqueue"])
            offcpu = _family(HistogramMetricFamily, SPECS["offcpu"])
            if snap is not None:
                for stage in KERNEL_STAGES:
                    _histogram(runqueue, [stage], snap.runqueue.get(stage))
                    for reason in OFFCPU_REASONS:
                        _histogram(offcpu, [stage, reason], snap.offcpu.get((stage, reason)))
            yield runqueue
            yield offcpu
        if self.syscalls:
            syscall = _family(HistogramMetricFamily, SPECS["syscall"])
            if snap is not None:
                for stage in KERNEL_STAGES:
                    for family in SYSCALL_FAMILIES:
                        _histogram(syscall, [stage, family], snap.syscall.get((stage, family)))
            yield syscall
        if self.tcp_retransmits:
            retransmits = _family(CounterMetricFamily, SPECS["tcp_retransmits"])
            if snap is not None:
                for state in TCP_STATE_LABELS:
                    retransmits.add_metric([state], snap.tcp_retransmits.get(state, 0))
            yield retransmits
