"""OTLP/HTTP export against a real receiver, and a dead collector that must cost requests nothing."""

from __future__ import annotations

import socket
import statistics
import time
from contextlib import ExitStack

import pytest

from rag.stages import DEFAULT_STAGES

SERVED = ("queue", *DEFAULT_STAGES)  # over HTTP a query also reports its wait (admission, thread pool)
from stack.otlp_receiver import OtlpReceiver
from telemetry.otlp_metrics import REQUEST_DURATION, STAGE_DURATION
from telemetry.tracing import OTLP_ENDPOINT_VARIABLES
from telemetry_testkit import QUERIES, scrape, serve, total, wait_for

SERVER = 2  # opentelemetry.proto.trace.v1.Span.SpanKind.SPAN_KIND_SERVER
STATUS_OK_UNSET = 0


def attrs(key_values) -> dict:
    return {kv.key: getattr(kv.value, kv.value.WhichOneof("value")) for kv in key_values}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def otlp_env(monkeypatch):
    """Point the standard OTLP variables at ``endpoint`` (set before Telemetry is built: exporters read them then)."""
    for name in (*OTLP_ENDPOINT_VARIABLES, "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_HEADERS",
                 "OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"):
        monkeypatch.delenv(name, raising=False)
    return lambda endpoint: monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)


def test_spans_and_exponential_histograms_reach_the_collector(settings, pipeline, otlp_env):
    receiver = OtlpReceiver()
    with receiver as endpoint:
        otlp_env(endpoint)
        with serve(settings, pipeline, otlp="auto", otlp_metrics_interval_s=0.5) as s:
            assert s.telemetry.otlp, "otlp=auto must switch on when OTEL_EXPORTER_OTLP_ENDPOINT is set"
            for q in QUERIES[:3]:
                assert s.query(q).status_code == 200
            assert s.query(QUERIES[3], route="/v1/query/stream").status_code == 200

            def request_spans():
                found = [sp for sp in receiver.spans() if sp.kind == SERVER]
                return found if len(found) >= 4 else None

            s.telemetry.force_flush()
            roots = wait_for(request_spans, 15, what="4 request spans at the receiver")

            def stage_counts(name, key):
                """Per-``key`` counts of the newest export of ``name``, once it covers all 4 requests."""
                points = receiver.metric_points(name)
                if not points:
                    return None
                counts = {}
                for dp in points[-1].exponential_histogram.data_points:
                    counts[attrs(dp.attributes)[key]] = counts.get(attrs(dp.attributes)[key], 0) + dp.count
                return counts if sum(counts.values()) >= (4 * len(SERVED) if key == "stage" else 4) else None

            wait_for(lambda: stage_counts(STAGE_DURATION, "stage"), 15, what="stage duration metrics")
            wait_for(lambda: stage_counts(REQUEST_DURATION, "route"), 15, what="request duration metrics")

    # Traces: one SERVER span per request, one child per stage, linked by trace and parent ids.
    assert sorted(sp.name for sp in roots) == ["POST /v1/query"] * 3 + ["POST /v1/query/stream"]
    spans = receiver.spans()
    for root in roots:
        assert len(root.trace_id) == 16 and root.parent_span_id == b""
        assert attrs(root.attributes)["http.response.status_code"] == 200
        kids = [sp for sp in spans if sp.parent_span_id == root.span_id]
        assert sorted(attrs(k.attributes)["rag.stage"] for k in kids) == sorted(SERVED)
        for kid in kids:
            a = attrs(kid.attributes)
            assert kid.trace_id == root.trace_id
            assert root.start_time_unix_nano <= kid.start_time_unix_nano <= kid.end_time_unix_nano
            assert kid.end_time_unix_nano <= root.end_time_unix_nano
            if a["rag.stage"].startswith("retrieve_"):
                assert kid.name == "retrieval " + a["rag.stage"].removeprefix("retrieve_")
                assert a["gen_ai.operation.name"] == "retrieval"
                assert a["gen_ai.retrieval.top_k"] == 5
                assert a["gen_ai.data_source.id"] == pipeline.index.manifest["corpus"]["name"]
    resources = [attrs(rs.resource.attributes) for req in receiver.traces for rs in req.resource_spans]
    assert all(r["service.name"] == "ragheat" for r in resources)

    # Metrics: base-2 exponential histograms (not explicit buckets) with the closed label set.
    labels = {STAGE_DURATION: {"stage", "qps_bucket", "outcome"},
              REQUEST_DURATION: {"route", "qps_bucket", "outcome"}}
    for name, keys in labels.items():
        metrics = receiver.metric_points(name)
        assert metrics, name
        for metric in metrics:
            assert metric.WhichOneof("data") == "exponential_histogram", (name, metric.WhichOneof("data"))
            assert metric.unit == "s"
        newest = metrics[-1].exponential_histogram.data_points
        assert newest and all(dp.count > 0 for dp in newest)
        for dp in newest:
            a = attrs(dp.attributes)
            assert set(a) == keys, (name, a)
            assert a["outcome"] == "ok" and a["qps_bucket"] in ("0-1", "1-10", "10-50", "50-200", "200+")
            assert sum(dp.positive.bucket_counts) + sum(dp.negative.bucket_counts) + dp.zero_count == dp.count
            assert 0 < dp.min <= dp.max and dp.sum > 0
    stages = {}
    for dp in receiver.metric_points(STAGE_DURATION)[-1].exponential_histogram.data_points:
        stages[attrs(dp.attributes)["stage"]] = stages.get(attrs(dp.attributes)["stage"], 0) + dp.count
    assert stages == {stage: 4 for stage in SERVED}
    routes = {}
    for dp in receiver.metric_points(REQUEST_DURATION)[-1].exponential_histogram.data_points:
        routes[attrs(dp.attributes)["route"]] = routes.get(attrs(dp.attributes)["route"], 0) + dp.count
    assert routes == {"/v1/query": 3, "/v1/query/stream": 1}

    # Exemplars: every request was traced, so the points carry exemplars (each sent once, the latest per bucket),
    # each naming a request's trace and its SERVER span; a request exemplar's value is that span's duration.
    by_trace = {root.trace_id: root for root in roots}
    for name in (STAGE_DURATION, REQUEST_DURATION):
        exemplars = [e for metric in receiver.metric_points(name)
                     for dp in metric.exponential_histogram.data_points for e in dp.exemplars]
        assert exemplars, f"{name}: no exemplar reached the receiver"
        for e in exemplars:
            root = by_trace.get(e.trace_id)
            assert root is not None, f"{name}: exemplar trace {e.trace_id.hex()} is no exported trace"
            assert e.span_id == root.span_id
            assert root.start_time_unix_nano <= e.time_unix_nano
            if name == REQUEST_DURATION:
                assert e.as_double == pytest.approx((root.end_time_unix_nano - root.start_time_unix_nano) / 1e9,
                                                    abs=2e-6)


def silent_port(stack: ExitStack) -> int:
    """A port that accepts connections (the kernel's backlog does) and never answers: a hung collector."""
    listener = stack.enter_context(socket.socket())
    listener.bind(("127.0.0.1", 0))
    listener.listen(1024)
    return listener.getsockname()[1]


@pytest.mark.parametrize("collector", ["closed_port", "never_answers"])
def test_dead_collector_costs_requests_nothing_and_drops_are_counted(settings, pipeline, otlp_env, collector):
    with ExitStack() as stack:
        port = closed_port() if collector == "closed_port" else silent_port(stack)
        otlp_env(f"http://127.0.0.1:{port}")
        off = stack.enter_context(serve(settings, pipeline, otlp="off"))
        dead = stack.enter_context(serve(settings, pipeline, otlp="on", export_timeout_s=1.0, span_queue_size=16,
                                         export_batch_size=8, otlp_metrics_interval_s=0.5))
        assert dead.telemetry.otlp and not off.telemetry.otlp
        for served in (off, dead):  # warm both connections and code paths
            for q in QUERIES[:3]:
                assert served.query(q).status_code == 200
        latencies = {"off": [], "dead": []}
        for i in range(40):  # interleaved, so both see the same machine load
            for name, served in (("off", off), ("dead", dead)):
                start = time.perf_counter()
                response = served.query(QUERIES[i % len(QUERIES)])
                latencies[name].append(time.perf_counter() - start)
                assert response.status_code == 200, (name, response.text)
        median_off, median_dead = statistics.median(latencies["off"]), statistics.median(latencies["dead"])
        assert median_dead <= median_off * 1.5 + 0.002, (median_dead, median_off)

        def dropped(signal, **reason):
            return total(scrape(dead.url), "ragheat_telemetry_dropped_total", signal=signal, **reason)

        # A refused connection fails each export at once; a collector that never answers holds the export
        # thread for export_timeout_s while 43 requests x 6 spans arrive at a queue of 16.
        reason = "export_failed" if collector == "closed_port" else "queue_full"
        wait_for(lambda: dropped("spans", reason=reason), 10, 0.2, what=f"spans dropped for {reason}")
        wait_for(lambda: dropped("metrics"), 10, 0.2, what="failed metric exports to be counted")
        assert total(scrape(off.url), "ragheat_telemetry_dropped_total") == 0
    assert dead.shutdown_s < 15, f"shutdown with a dead collector took {dead.shutdown_s:.1f} s"
