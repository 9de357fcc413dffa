"""OTLP metrics push with base-2 exponential histograms, each value recorded with a logarithm and a dict update.

Why not the OpenTelemetry SDK's MeterProvider: its histogram ``record()`` does far more per value
(attribute normalisation, locks, aggregation objects), and a request records six values, a visible share
of a saturated service (docs/benchmarks.md, Telemetry overhead). Here each (metric,
attributes) pair is a plain counter map at a fixed scale; a background thread encodes the cumulative
state with ``opentelemetry-proto`` and POSTs it to the OTLP/HTTP endpoint every interval.

Observations of traced requests carry an exemplar (trace id, span id, value, time): each point sends the latest
traced observation of every bucket seen since the previous export, so the OTel Collector's remote write hands
Prometheus exemplars that open those traces, as the scraped ``/metrics`` does with its own.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

import httpx
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.resource.v1 import resource_pb2

log = logging.getLogger("ragheat.telemetry")

SCALE = 4  # buckets grow by 2**(1/16) ≈ 4.4 %: relative error of a quantile read off them ≤ 2.2 %
_FACTOR = 2.0 ** SCALE

STAGE_DURATION = "ragheat.stage.duration"
REQUEST_DURATION = "ragheat.request.duration"
UNIT = "s"
DESCRIPTIONS = {STAGE_DURATION: "Time one RAG pipeline stage took for one request.",
                REQUEST_DURATION: "End-to-end time of one API request."}

_UNIT_SUFFIXES = {"s": "seconds"}


def prometheus_name(otlp_name: str, unit: str = UNIT) -> str:
    """The name Prometheus stores an OTLP metric under when the OTel Collector's ``prometheusremotewrite`` exporter
    forwards it (``add_metric_suffixes`` on, its default): characters outside ``[a-zA-Z0-9_:]`` become ``_`` and the
    unit becomes a suffix (``s`` -> ``_seconds``). An exponential histogram arrives as one native histogram series
    of exactly this name (no ``_bucket``/``_sum``/``_count``)."""
    name = "".join(c if c.isascii() and (c.isalnum() or c in "_:") else "_" for c in otlp_name)
    suffix = _UNIT_SUFFIXES.get(unit, unit)
    return name if not suffix or name.endswith("_" + suffix) else f"{name}_{suffix}"


@dataclass
class Base2Histogram:
    """Positive values in buckets ``(base**i, base**(i+1)]``, ``base = 2**(2**-SCALE)``, as OTLP defines them."""

    counts: dict[int, int] = field(default_factory=dict)
    zero_count: int = 0
    count: int = 0
    total: float = 0.0
    low: float = math.inf
    high: float = -math.inf
    exemplars: dict[int | None, tuple[float, int, int, int]] = field(default_factory=dict)
    """Bucket index (None: the zero bucket) -> (value, unix ns, trace id, span id) of the latest traced observation
    there since the last export."""

    def record(self, value: float, trace: tuple[int, int] | None = None) -> None:
        self.count += 1
        self.total += value
        self.low = min(self.low, value)
        self.high = max(self.high, value)
        if value <= 0.0:
            self.zero_count += 1
            index = None
        else:
            index = math.ceil(math.log2(value) * _FACTOR) - 1
            self.counts[index] = self.counts.get(index, 0) + 1
        if trace is not None:
            self.exemplars[index] = (value, time.time_ns(), *trace)


def endpoint_from_env(environ: Mapping[str, str] = os.environ) -> str | None:
    """The metrics URL the standard OTEL_EXPORTER_OTLP_* variables name (OTLP/HTTP)."""
    specific = environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
    if specific:
        return specific
    base = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    return base.rstrip("/") + "/v1/metrics" if base else None


def parse_headers(raw: str | None) -> dict[str, str]:
    """An ``OTEL_EXPORTER_OTLP_*HEADERS`` value: comma-separated ``key=value``, values URL-encoded (the spec's
    format, parsed as the OpenTelemetry SDK parses it: ``Authorization=Bearer%20abc`` is ``Bearer abc``)."""
    from opentelemetry.util.re import parse_env_headers

    return parse_env_headers(raw or "", liberal=True)


def headers_from_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """OTLP metrics export headers from the standard variables (URL-decoded)."""
    return parse_headers(environ.get("OTEL_EXPORTER_OTLP_METRICS_HEADERS") or environ.get("OTEL_EXPORTER_OTLP_HEADERS"))


class OtlpHistogramPusher:
    """Cumulative exponential histograms per (metric, attributes), pushed every ``interval_s``."""

    def __init__(self, endpoint: str, *, service_name: str, service_version: str, interval_s: float,
                 timeout_s: float, on_drop: Callable[[int], None], headers: Mapping[str, str] | None = None,
                 descriptions: Mapping[str, str] | None = None) -> None:
        self.endpoint, self.interval_s, self.timeout_s, self.on_drop = endpoint, interval_s, timeout_s, on_drop
        self.headers = {"Content-Type": "application/x-protobuf", **(headers or {})}
        self.descriptions = dict(descriptions or {})
        self.resource = resource_pb2.Resource(attributes=[
            _kv("service.name", service_name), _kv("service.version", service_version)])
        self.start_ns = time.time_ns()
        self._histograms: dict[tuple[str, tuple], Base2Histogram] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._client = httpx.Client(timeout=timeout_s)
        self._thread = threading.Thread(target=self._run, name="ragheat-otlp-metrics", daemon=True)
        self._thread.start()

    def record(self, name: str, value: float, attributes: tuple[tuple[str, str], ...],
               trace: tuple[int, int] | None = None) -> None:
        """One observation; ``trace`` (trace id, span id) for a traced request, which becomes an exemplar."""
        key = (name, attributes)
        with self._lock:
            histogram = self._histograms.get(key)
            if histogram is None:
                histogram = self._histograms[key] = Base2Histogram()
            histogram.record(value, trace)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.push()

    def encode(self) -> bytes:
        now = time.time_ns()
        by_metric: dict[str, list] = {}
        with self._lock:
            for (name, attributes), h in self._histograms.items():
                offset = min(h.counts) if h.counts else 0
                width = (max(h.counts) - offset + 1) if h.counts else 0
                buckets = [0] * width
                for index, count in h.counts.items():
                    buckets[index - offset] = count
                # Each exemplar goes out once: the next export carries only newer traced observations.
                exemplars = [metrics_pb2.Exemplar(as_double=value, time_unix_nano=at,
                                                  trace_id=trace_id.to_bytes(16, "big"),
                                                  span_id=span_id.to_bytes(8, "big"))
                             for value, at, trace_id, span_id in h.exemplars.values()]
                h.exemplars = {}
                by_metric.setdefault(name, []).append(metrics_pb2.ExponentialHistogramDataPoint(
                    attributes=[_kv(k, v) for k, v in attributes], start_time_unix_nano=self.start_ns,
                    time_unix_nano=now, count=h.count, sum=h.total, scale=SCALE, zero_count=h.zero_count,
                    positive=metrics_pb2.ExponentialHistogramDataPoint.Buckets(offset=offset, bucket_counts=buckets),
                    min=h.low, max=h.high, exemplars=exemplars))
        metrics = [metrics_pb2.Metric(name=name, unit=UNIT, description=self.descriptions.get(name, ""),
                                      exponential_histogram=metrics_pb2.ExponentialHistogram(
                                          data_points=points,
                                          aggregation_temporality=metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE))
                   for name, points in by_metric.items()]
        request = metrics_service_pb2.ExportMetricsServiceRequest(resource_metrics=[metrics_pb2.ResourceMetrics(
            resource=self.resource,
            scope_metrics=[metrics_pb2.ScopeMetrics(scope=common_pb2.InstrumentationScope(name="ragheat"),
                                                    metrics=metrics)])])
        return request.SerializeToString()

    def push(self) -> bool:
        """Send the current state once; a failure is counted, never raised."""
        if not self._histograms:
            return True
        try:
            response = self._client.post(self.endpoint, content=self.encode(), headers=self.headers)
            if response.status_code // 100 == 2:
                return True
            log.warning("OTLP metrics push got HTTP %s", response.status_code)
        except httpx.HTTPError as exc:
            log.debug("OTLP metrics push failed: %s", exc)
        self.on_drop(1)
        return False

    def shutdown(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.timeout_s + 1)
        self.push()
        self._client.close()


def _kv(key: str, value: str) -> common_pb2.KeyValue:
    return common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(string_value=str(value)))
