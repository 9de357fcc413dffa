"""The OTLP collector drill's second half: after an outage (port refused, or a collector that accepts and never
answers), a real receiver comes back on the same address and spans and metrics reach it again, with no restart of
the service. The outage itself (requests unaffected, drops counted) is ``test_otlp.py``'s drill; here it is repeated
only as the set-up, with its drops asserted, before the return."""

from __future__ import annotations

import socket
import time
from contextlib import ExitStack

import pytest

from stack.otlp_receiver import OtlpReceiver
from telemetry.otlp_metrics import REQUEST_DURATION
from telemetry.tracing import OTLP_ENDPOINT_VARIABLES
from telemetry_testkit import QUERIES, scrape, serve, total, wait_for

SERVER = 2  # opentelemetry.proto.trace.v1.Span.SpanKind.SPAN_KIND_SERVER
OUTAGE_REQUESTS, RETURN_REQUESTS = 12, 6


@pytest.fixture
def otlp_env(monkeypatch):
    for name in (*OTLP_ENDPOINT_VARIABLES, "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_HEADERS",
                 "OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"):
        monkeypatch.delenv(name, raising=False)
    return lambda endpoint: monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request_count(receiver: OtlpReceiver) -> int:
    """Queries counted by the newest request-duration export (cumulative: every query since start-up)."""
    points = receiver.metric_points(REQUEST_DURATION)
    if not points:
        return 0
    return sum(dp.count for dp in points[-1].exponential_histogram.data_points
               if any(kv.key == "route" and kv.value.string_value == "/v1/query" for kv in dp.attributes))


@pytest.mark.parametrize("outage", ["refused", "hung"])
def test_spans_and_metrics_reach_the_collector_again_when_it_returns(settings, pipeline, otlp_env, outage):
    with ExitStack() as stack:
        if outage == "hung":  # accepts (the kernel's backlog does) and never answers
            silent = socket.socket()
            silent.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            silent.bind(("127.0.0.1", 0))
            silent.listen(1024)
            stack.callback(silent.close)
            port = silent.getsockname()[1]
        else:
            port = free_port()
        otlp_env(f"http://127.0.0.1:{port}")
        served = stack.enter_context(serve(settings, pipeline, otlp="on", export_timeout_s=1.0, span_queue_size=16,
                                           export_batch_size=8, otlp_metrics_interval_s=0.5))

        def dropped(signal: str) -> float:
            return total(scrape(served.url), "ragheat_telemetry_dropped_total", signal=signal)

        # The outage: every request served, spans and metric pushes dropped and counted.
        for i in range(OUTAGE_REQUESTS):
            response = served.query(QUERIES[i % len(QUERIES)])
            assert response.status_code == 200, (outage, response.text)
        wait_for(lambda: dropped("spans"), 15, 0.2, what=f"spans dropped while the collector is {outage}")
        wait_for(lambda: dropped("metrics"), 15, 0.2, what=f"metric pushes dropped while the collector is {outage}")

        # The collector returns on the same address; the service is not restarted.
        if outage == "hung":
            silent.close()  # connections waiting in its backlog are reset: their exports fail, counted
        receiver = OtlpReceiver(port=port)
        assert receiver.endpoint == f"http://127.0.0.1:{port}"
        stack.enter_context(receiver)
        since_ns = time.time_ns()  # spans carry wall-clock start times
        # Once it is back nothing may be dropped: each request's spans are flushed before the next is sent, as the
        # queue is kept small for the outage (a busy machine's exporter thread could fall behind it otherwise).
        for i in range(RETURN_REQUESTS):
            assert served.query(QUERIES[i % len(QUERIES)]).status_code == 200
            served.telemetry.force_flush()

        def roots_since(start_ns: int) -> list:
            return [sp for sp in receiver.spans()
                    if sp.kind == SERVER and sp.name == "POST /v1/query" and sp.start_time_unix_nano >= start_ns]

        served.telemetry.force_flush()
        wait_for(lambda: len(roots_since(since_ns)) >= RETURN_REQUESTS, 20, 0.1,
                 what="spans of the requests made after the collector returned")
        # Metrics are cumulative: the first push after the return counts every request, the outage's included.
        served_so_far = OUTAGE_REQUESTS + RETURN_REQUESTS
        wait_for(lambda: request_count(receiver) >= served_so_far, 20, 0.1,
                 what=f"a metrics push counting all {served_so_far} requests")
        assert request_count(receiver) == served_so_far

        # Recovered for good: more requests, every span exported, no further drop of either signal.
        drops = dropped("spans"), dropped("metrics")
        last_ns = time.time_ns()
        for i in range(RETURN_REQUESTS):
            assert served.query(QUERIES[i % len(QUERIES)]).status_code == 200
            served.telemetry.force_flush()
        served.telemetry.force_flush()
        wait_for(lambda: request_count(receiver) == served_so_far + RETURN_REQUESTS, 20, 0.1,
                 what="a metrics push counting the last requests")
        wait_for(lambda: len(roots_since(last_ns)) >= RETURN_REQUESTS, 20, 0.1, what="spans of the last requests")
        last = roots_since(last_ns)
        assert len(last) == RETURN_REQUESTS
        for root in last:  # each with its stages' spans
            assert any(sp.parent_span_id == root.span_id for sp in receiver.spans()), root.name
        assert (dropped("spans"), dropped("metrics")) == drops, "drops after the collector had returned"
    assert served.shutdown_s < 15, f"shutdown took {served.shutdown_s:.1f} s"

