"""A minimal OTLP/HTTP (protobuf) receiver: decodes what exporters send, keeps it in memory.

Used by the tests and the overhead benchmark as the real far end of OTLP export, where the
OpenTelemetry Collector would be in production. It answers ``POST /v1/traces`` and
``POST /v1/metrics`` with the protocol's empty success response.
"""

from __future__ import annotations

import gzip
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

_MESSAGES = {
    "/v1/traces": (trace_service_pb2.ExportTraceServiceRequest, trace_service_pb2.ExportTraceServiceResponse),
    "/v1/metrics": (metrics_service_pb2.ExportMetricsServiceRequest, metrics_service_pb2.ExportMetricsServiceResponse),
}


class OtlpReceiver:
    """``with OtlpReceiver() as endpoint:`` listens on a free loopback port; ``endpoint`` is its base URL."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.traces: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.metrics: list[metrics_service_pb2.ExportMetricsServiceRequest] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - the http.server API
                kinds = _MESSAGES.get(self.path)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if kinds is None:
                    self.send_response(404)
                    self.end_headers()
                    return
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = kinds[0]()
                request.ParseFromString(body)
                with receiver._lock:
                    (receiver.traces if self.path == "/v1/traces" else receiver.metrics).append(request)
                payload = kinds[1]().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):  # keep test output clean
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.endpoint = f"http://{host}:{self.server.server_address[1]}"

    def __enter__(self) -> str:
        self.thread = threading.Thread(target=self.server.serve_forever, name="otlp-receiver", daemon=True)
        self.thread.start()
        return self.endpoint

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def spans(self) -> list:
        """Every received span (protobuf ``Span``), flattened."""
        with self._lock:
            return [span for request in self.traces for rs in request.resource_spans
                    for ss in rs.scope_spans for span in ss.spans]

    def metric_points(self, name: str) -> list:
        """Every received metric named ``name`` (protobuf ``Metric``)."""
        with self._lock:
            return [metric for request in self.metrics for rm in request.resource_metrics
                    for sm in rm.scope_metrics for metric in sm.metrics if metric.name == name]
