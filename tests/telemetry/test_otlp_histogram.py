"""The base-2 exponential histogram pushed over OTLP: bucket maths and encoding."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2

from telemetry.otlp_metrics import (REQUEST_DURATION, SCALE, STAGE_DURATION, Base2Histogram, OtlpHistogramPusher,
                                    endpoint_from_env, headers_from_env, prometheus_name)

BASE = 2 ** (2 ** -SCALE)


def test_bucket_boundaries_follow_the_otlp_definition():
    h = Base2Histogram()
    for i in (-200, -3, 0, 1, 17):  # bucket i holds (base**i, base**(i+1)]
        h.counts.clear()
        h.record(BASE ** (i + 0.5))
        assert list(h.counts) == [i]
    h.counts.clear()
    h.record(1.0)  # exactly base**0: upper bound of bucket -1
    assert list(h.counts) == [-1]
    h.record(0.0)
    assert h.zero_count == 1 and h.count == 7 and h.low == 0.0


def test_quantiles_read_off_the_buckets_are_within_the_scale_error():
    values = np.random.default_rng(0).lognormal(mean=-4, sigma=1.0, size=50_000)
    h = Base2Histogram()
    for v in values:
        h.record(float(v))
    assert h.count == len(values) and h.total == pytest.approx(values.sum())
    cumulative, target = 0, 0.99 * h.count
    for index in sorted(h.counts):
        cumulative += h.counts[index]
        if cumulative >= target:
            upper = BASE ** (index + 1)
            break
    exact = float(np.percentile(values, 99))
    assert exact <= upper * (1 + 1e-9) and upper / exact < BASE  # within one bucket (4.4 %)


def test_encoding_and_env(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "a=1, b = two")
    assert endpoint_from_env() == "http://collector:4318/v1/metrics"
    assert headers_from_env() == {"a": "1", "b": "two"}
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://m:1/x")
    assert endpoint_from_env() == "http://m:1/x"
    drops = []
    pusher = OtlpHistogramPusher("http://127.0.0.1:9/v1/metrics", service_name="s", service_version="1",
                                 interval_s=3600, timeout_s=0.5, on_drop=drops.append)
    for v in (0.001, 0.002, 0.002, 0.5):
        pusher.record("ragheat.stage.duration", v, (("stage", "embed"),))
    request = metrics_service_pb2.ExportMetricsServiceRequest()
    request.ParseFromString(pusher.encode())
    metric = request.resource_metrics[0].scope_metrics[0].metrics[0]
    point = metric.exponential_histogram.data_points[0]
    assert metric.name == "ragheat.stage.duration" and point.count == 4 and point.scale == SCALE
    assert sum(point.positive.bucket_counts) == 4 and point.max == 0.5
    assert point.positive.offset == math.ceil(math.log2(0.001) * 2 ** SCALE) - 1
    assert pusher.push() is False and drops == [1]  # nothing listens on port 9: counted, not raised
    pusher.shutdown()


def test_traced_observations_become_exemplars_once():
    """A traced observation travels as an exemplar on its point: value, trace id, span id, time; the latest per
    bucket since the previous export, each sent once; untraced observations add none."""
    pusher = OtlpHistogramPusher("http://127.0.0.1:9/v1/metrics", service_name="s", service_version="1",
                                 interval_s=3600, timeout_s=0.5, on_drop=lambda n: None)

    def exported() -> list:
        request = metrics_service_pb2.ExportMetricsServiceRequest()
        request.ParseFromString(pusher.encode())
        return list(request.resource_metrics[0].scope_metrics[0].metrics[0].exponential_histogram.data_points[0].exemplars)

    trace_a, span_a = 0x0AF7651916CD43DD8448EB211C80319C, 0x00F067AA0BA902B7
    trace_b, span_b = 0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x53995C3F42CD8AD8
    before = time.time_ns()
    pusher.record(STAGE_DURATION, 0.010, (("stage", "embed"),), (trace_a, span_a))
    pusher.record(STAGE_DURATION, 0.0101, (("stage", "embed"),), (trace_b, span_b))  # same bucket: b replaces a
    pusher.record(STAGE_DURATION, 0.300, (("stage", "embed"),))                       # untraced: no exemplar
    pusher.record(STAGE_DURATION, 0.0, (("stage", "embed"),), (trace_a, span_a))      # the zero bucket has its own
    exemplars = exported()
    assert sorted((e.as_double, e.trace_id.hex(), e.span_id.hex()) for e in exemplars) == [
        (0.0, "0af7651916cd43dd8448eb211c80319c", "00f067aa0ba902b7"),
        (0.0101, "4bf92f3577b34da6a3ce929d0e0e4736", "53995c3f42cd8ad8"),
    ]
    assert all(before <= e.time_unix_nano <= time.time_ns() for e in exemplars)
    assert exported() == []  # sent once: the next export has only what was traced since
    pusher.record(STAGE_DURATION, 0.5, (("stage", "embed"),), (trace_b, span_b))
    assert [e.as_double for e in exported()] == [0.5]
    pusher.shutdown()


def test_prometheus_name_is_what_the_collectors_remote_write_stores():
    """prometheusremotewrite (add_metric_suffixes, its default) turns dots into underscores and the unit s into
    _seconds; the native histograms the dashboards read are named so."""
    assert prometheus_name(STAGE_DURATION) == "ragheat_stage_duration_seconds"
    assert prometheus_name(REQUEST_DURATION) == "ragheat_request_duration_seconds"
    assert prometheus_name("http.server.duration_seconds") == "http_server_duration_seconds"
    assert prometheus_name("queue-depth", "") == "queue_depth"
