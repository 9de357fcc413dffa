"""The Prometheus metrics contract: names, help, closed label sets. Recording lives in ``recorder.py``.

Every label value comes from a closed set declared here (or in ``rag.pipeline.STAGES`` and the
configured qps buckets); nothing user-controlled (query text, paths, ids) ever becomes a label.
"""

from __future__ import annotations

from typing import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from rag.pipeline import RETRIEVERS, STAGES
from telemetry.buckets import LATENCY_SECONDS, RETRIEVED_DOCUMENTS

ROUTES = ("/v1/query", "/v1/query/stream")
STAGE_OUTCOMES = ("ok", "error")
REQUEST_OUTCOMES = ("ok", "rejected", "error")  # 2xx/3xx, 4xx (bad input, not ready), 5xx
SIGNALS = ("spans", "metrics")
DROP_REASONS = ("queue_full", "export_failed")

EXPECTED_METRICS = [
    "ragheat_stage_duration_seconds",
    "ragheat_request_duration_seconds",
    "ragheat_requests_in_flight",
    "ragheat_qps",
    "ragheat_retrieved_documents",
    "ragheat_stage_errors_total",
    "ragheat_requests_total",
    "ragheat_telemetry_dropped_total",
]
"""Metric families a scrape of a running service must contain (as prometheus_client's parser names them;
counters are listed with ``_total``, which the parser strips from the family name)."""


class PrometheusMetrics:
    """The service's metric objects, registered on ``registry`` (a fresh one per app or test)."""

    def __init__(self, registry: CollectorRegistry, qps_labels: Sequence[str]) -> None:
        self.qps_labels = tuple(qps_labels)
        self.stage_duration = Histogram(
            "ragheat_stage_duration_seconds",
            "Time one RAG pipeline stage took for one request, by stage, load level at request start and outcome.",
            ["stage", "qps_bucket", "outcome"], buckets=LATENCY_SECONDS, registry=registry)
        self.request_duration = Histogram(
            "ragheat_request_duration_seconds",
            "End-to-end time of one API request as the server saw it, by route, load level and outcome.",
            ["route", "qps_bucket", "outcome"], buckets=LATENCY_SECONDS, registry=registry)
        self.requests = Counter(
            "ragheat_requests", "API requests by route and HTTP status class.",
            ["route", "status_class"], registry=registry)
        self.in_flight = Gauge(
            "ragheat_requests_in_flight", "API requests being served right now.", ["route"], registry=registry)
        self.qps = Gauge(
            "ragheat_qps", "API request rate (requests per second) over the sliding qps window.", registry=registry)
        self.retrieved = Histogram(
            "ragheat_retrieved_documents", "Chunks a retriever returned for one request, before fusion.",
            ["retriever"], buckets=RETRIEVED_DOCUMENTS, registry=registry)
        self.stage_errors = Counter(
            "ragheat_stage_errors", "Requests that failed in a pipeline stage, by stage.", ["stage"],
            registry=registry)
        self.telemetry_dropped = Counter(
            "ragheat_telemetry_dropped", "Spans or metric batches dropped instead of slowing requests, by reason.",
            ["signal", "reason"], registry=registry)
        self._children: dict = {}
        # Create every closed-set series up front: a rate() over a series that appears late reads as missing.
        for route in ROUTES:
            self.in_flight.labels(route)
        for stage in STAGES:
            self.stage_errors.labels(stage)
        for retriever in RETRIEVERS:
            self.retrieved.labels(retriever)
        for signal in SIGNALS:
            for reason in DROP_REASONS:
                self.telemetry_dropped.labels(signal, reason)


    def child(self, metric, *label_values):
        """``metric.labels(*label_values)``, cached: ``labels()`` validates and locks on every call, which
        is a measurable share of per-request cost when a request makes eight observations."""
        key = (id(metric), label_values)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*label_values)
        return found


def status_class(status: int) -> str:
    return f"{status // 100}xx" if 100 <= status < 600 else "other"


def request_outcome(status: int) -> str:
    return "error" if status >= 500 else "rejected" if status >= 400 else "ok"
