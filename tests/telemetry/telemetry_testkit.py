"""Helpers shared by the telemetry tests: a real instrumented server, real scrapes, polling."""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from ragheat.service import build_service
from stack.servers import BackgroundServer

QUERIES = [
    "0-dimensional biomaterials lack inductive properties.",
    "Vitamin D deficiency is associated with bone density loss.",
    "Tumor-associated macrophages promote cancer progression.",
    "Antibiotic resistance spreads through horizontal gene transfer.",
    "Aspirin reduces the risk of colorectal cancer.",
    "Obesity increases the risk of type 2 diabetes.",
]


@dataclass
class Served:
    url: str
    telemetry: object
    exporter: InMemorySpanExporter | None
    client: httpx.Client
    shutdown_s: float | None = None  # how long Telemetry.shutdown() took, once the server has stopped

    def query(self, text: str, route: str = "/v1/query", **body) -> httpx.Response:
        return self.client.post(route, json={"query": text, **body})


def with_telemetry(settings, **update):
    """``settings`` with its telemetry section updated."""
    return settings.model_copy(update={"telemetry": settings.telemetry.model_copy(update=update)})


@contextmanager
def serve(settings, pipeline, *, exporter: InMemorySpanExporter | None = None, environ=None, **telemetry_update):
    """A real uvicorn server with telemetry wired in exactly as ``ragheat serve`` does it (``ragheat.service``).
    Every request is traced unless the test says otherwise (the default samples 10 %)."""
    telemetry_update.setdefault("trace_sample_ratio", 1.0)
    s = with_telemetry(settings, **telemetry_update)
    service = build_service(s, pipeline, registry=CollectorRegistry(), span_exporter=exporter, environ=environ)
    served = None
    try:
        with BackgroundServer(service.app) as url, httpx.Client(base_url=url, timeout=30) as client:
            served = Served(url, service.telemetry, exporter, client)
            yield served
    finally:
        start = time.perf_counter()
        service.close()
        if served is not None:
            served.shutdown_s = time.perf_counter() - start


def scrape(url: str, openmetrics: bool = False) -> list:
    headers = {"Accept": "application/openmetrics-text; version=1.0.0"} if openmetrics else {}
    response = httpx.get(url.rstrip("/") + "/metrics", headers=headers, timeout=10)
    response.raise_for_status()
    if openmetrics:
        assert response.headers["content-type"].startswith("application/openmetrics-text"), response.headers
        return list(parse_openmetrics(response.text))
    assert response.headers["content-type"].startswith("text/plain"), response.headers
    return list(parse_text(response.text))


def samples(families) -> list:
    return [s for fam in families for s in fam.samples]


def total(families, name: str, **labels) -> float:
    """Sum of every sample called ``name`` whose labels include ``labels``."""
    return sum(s.value for s in samples(families)
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def wait_for(predicate, timeout_s: float = 10.0, interval_s: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


def request_spans(exporter: InMemorySpanExporter, since_ns: int, route: str = "/v1/query") -> list:
    return [s for s in exporter.get_finished_spans()
            if s.kind == SpanKind.SERVER and s.name == f"POST {route}" and s.start_time >= since_ns]


def wait_for_request_spans(exporter, since_ns: int, count: int, route: str = "/v1/query",
                           timeout_s: float = 10.0) -> list:
    """The ``count`` request spans started since ``since_ns`` (span export is asynchronous)."""
    return wait_for(lambda: (lambda found: found if len(found) >= count else None)(
        request_spans(exporter, since_ns, route)), timeout_s, what=f"{count} spans of POST {route}")


def children(exporter: InMemorySpanExporter, parent) -> list:
    sid = parent.context.span_id
    return [s for s in exporter.get_finished_spans() if s.parent is not None and s.parent.span_id == sid]


def trace_id(span) -> str:
    return format(span.context.trace_id, "032x")
