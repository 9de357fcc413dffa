"""Turns one request's record (``rag.types.RequestRecord``: its stage timings, result or failure) into metrics,
exemplars and spans.

``rag/`` measures; this module exports. Stage spans are created after the fact from the stage
timings, so the pipeline stays free of tracing code and pays nothing for it on its hot path.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags
from prometheus_client import CollectorRegistry

from rag import __version__
from rag.quality.calibration import Calibration
from rag.settings import TelemetrySettings
from rag.stages import QUALITY_LEVELS, QUALITY_SIGNALS
from rag.types import CacheStats, RequestRecord, StageTiming
from telemetry.host import HostCollector
from telemetry.metrics import (QUALITY_POINTS, QUALITY_SIGNAL_FAMILIES, ROUTES, PrometheusMetrics, request_outcome,
                               status_class)
from telemetry.qps import QpsBuckets, SlidingWindowRate
from telemetry.tracing import BoundedSpanProcessor, otlp_configured

log = logging.getLogger("ragheat.telemetry")
_UNSET = Status(StatusCode.UNSET)


@dataclass
class RequestScope:
    """What is known when a request starts; handed back to ``finish``."""

    route: str
    qps_bucket: str
    start_perf: float
    start_ns: int
    trace: tuple[int, int, SpanContext | None] | None = None  # sampled: (trace id, span id, remote parent)
    trace_id: str | None = None


class Telemetry:
    """Metrics registry, span export and OTLP metrics for one service instance.

    >>> telemetry = Telemetry(TelemetrySettings())
    >>> scope = telemetry.start("/v1/query"); ...; telemetry.finish(scope, 200, RequestRecord(result=result))
    """

    def __init__(self, settings: TelemetrySettings, *, registry: CollectorRegistry | None = None,
                 span_exporter=None, data_source: str = "", model: str = "", environ: Mapping[str, str] = os.environ,
                 clock=time.monotonic, routes: Sequence[str] = ROUTES) -> None:
        self.settings = settings
        self.data_source, self.model = data_source, model
        self.registry = registry if registry is not None else CollectorRegistry()
        self.rate = SlidingWindowRate(settings.qps_window_s, min(0.25, settings.qps_window_s), clock=clock)
        self.buckets = QpsBuckets(settings.qps_edges)
        self.metrics = PrometheusMetrics(self.registry, self.buckets.labels, routes) if settings.metrics else None
        self.host = HostCollector() if self.metrics else None
        if self.metrics:
            self.metrics.qps.set_function(self.rate.rate)
            self.registry.register(self.host)
        self.otlp = settings.otlp == "on" or (settings.otlp == "auto" and otlp_configured(environ))
        self.span_processor = None
        self._ids = RandomIdGenerator()
        self._scope = InstrumentationScope("ragheat", __version__)
        self.otlp_metrics = None
        self.environ = environ
        if settings.tracing or self.otlp:
            self._setup_otel(span_exporter)
        self._propagator = None

    # -- set-up ------------------------------------------------------------------------------
    def _setup_otel(self, span_exporter) -> None:
        from opentelemetry.sdk.resources import Resource

        self.service_name = self.environ.get("OTEL_SERVICE_NAME", self.settings.service_name)
        resource = Resource.create({"service.name": self.service_name, "service.version": __version__})
        self.resource = resource
        if self.settings.tracing:
            if span_exporter is None and self.otlp:
                from telemetry.otlp_spans import OtlpHttpSpanExporter

                span_exporter = OtlpHttpSpanExporter(timeout_s=self.settings.export_timeout_s, environ=self.environ)
            if span_exporter is not None:
                self.span_processor = BoundedSpanProcessor(
                    span_exporter, lambda reason, n: self._dropped("spans", reason, n),
                    max_queue=self.settings.span_queue_size, batch_size=self.settings.export_batch_size)
        if self.otlp:
            self._setup_otlp_metrics()

    def _setup_otlp_metrics(self) -> None:
        from telemetry.otlp_metrics import DESCRIPTIONS, OtlpHistogramPusher, endpoint_from_env, headers_from_env

        endpoint = endpoint_from_env(self.environ)
        if endpoint is None:
            return  # otlp=on without an endpoint variable: traces use the exporter's default, metrics stay local
        self.otlp_metrics = OtlpHistogramPusher(
            endpoint, service_name=self.service_name, service_version=__version__,
            interval_s=self.settings.otlp_metrics_interval_s, timeout_s=self.settings.export_timeout_s,
            on_drop=lambda n: self._dropped("metrics", "export_failed", n), headers=headers_from_env(self.environ),
            descriptions=DESCRIPTIONS)

    def rejected(self, reason: str) -> None:
        """A request turned away before a route ran (``rag.api.access.Rejections`` calls this)."""
        if self.metrics:
            self.metrics.child(self.metrics.rejected, reason).inc()

    def shed(self, reason: str) -> None:
        """A query refused by admission control (``rag.api.admission.AdmissionController`` calls this)."""
        if self.metrics:
            self.metrics.child(self.metrics.shed, reason).inc()

    def level_changed(self, change) -> None:
        """The load controller stepped the quality ladder (``rag.api.steering.Steering`` calls this)."""
        if self.metrics:
            self.metrics.child(self.metrics.quality_level_changes, change.direction).inc()
            self.metrics.quality_level.set(QUALITY_LEVELS.index(change.after))

    def prioritized(self, priority: str, outcome: str) -> None:
        """A query of ``priority`` was answered or refused (admission control's tallies call this)."""
        if self.metrics:
            self.metrics.child(self.metrics.priority_requests, priority, outcome).inc()

    def reloaded(self, outcome: str) -> None:
        """An index reload attempt ended (``rag.index_generations.IndexGenerationSwitch.on_reload`` calls this)."""
        if self.metrics:
            self.metrics.child(self.metrics.index_reloads, outcome).inc()

    def watch_cache(self, stats: Callable[[], CacheStats | None]) -> None:
        """Export the answer cache's size at scrape time: ``stats`` returns the served generation's
        ``CacheStats`` (``RagPipeline.cache_stats``), or None without a cache (the gauges then read 0)."""
        if not self.metrics:
            return

        def read(field: str) -> float:
            try:
                current = stats()
            except Exception:  # a scrape must not fail because of it
                log.exception("reading the answer cache's size failed")
                return 0.0
            return 0.0 if current is None else float(getattr(current, field))

        self.metrics.cache_entries.set_function(lambda: read("entries"))
        self.metrics.cache_bytes.set_function(lambda: read("bytes"))

    def watch_quality(self, calibration: Calibration | None, threshold: float | None,
                      min_support: float | None = None) -> None:
        """Export the quality calibration in use: its threshold (``threshold``, which a setting may override), the
        least supported share of a written answer (``min_support``, the answer support's threshold) and the reference
        quantiles; nothing when quality is off."""
        if not self.metrics or threshold is None:
            return
        gauge = self.metrics.quality_calibration
        gauge.labels("best_similarity", "threshold").set(threshold)
        if min_support is not None:
            gauge.labels("answer_support", "threshold").set(min_support)
        for signal, quantiles in (calibration.reference if calibration is not None else {}).items():
            for quantile, value in quantiles.items():
                point = QUALITY_POINTS.get(quantile)
                if point is not None and signal in QUALITY_SIGNALS:
                    gauge.labels(signal, point).set(value)

    def judged(self, outcome: str) -> None:
        """A sampled answer's judgement ended (``rag.quality.judge.SampledJudge`` calls this, from its thread)."""
        if self.metrics:
            self.metrics.child(self.metrics.judged, outcome).inc()

    def _dropped(self, signal: str, reason: str, count: int) -> None:
        if self.metrics:
            self.metrics.telemetry_dropped.labels(signal, reason).inc(count)

    # -- per request ---------------------------------------------------------------------------
    def start(self, route: str, trace_headers: Mapping[str, str] | None = None) -> RequestScope:
        """Called when a request arrives: counts it towards the rate and opens its span. ``trace_headers``
        (W3C ``traceparent``/``tracestate``) continue the caller's trace and follow its sampling decision."""
        scope = RequestScope(route, self.buckets.label(self.rate.record()), time.perf_counter(), time.time_ns())
        if self.span_processor is not None:
            # Head sampling, decided before anything is built: an unsampled request costs nothing more here.
            # A caller's traceparent decides for it (parent-based sampling); otherwise trace_sample_ratio.
            parent = self._remote_parent(trace_headers) if trace_headers else None
            if parent is not None:
                sampled = parent.trace_flags.sampled
            else:
                sampled = random.random() < self.settings.trace_sample_ratio
            if sampled:
                trace_id = parent.trace_id if parent is not None else self._ids.generate_trace_id()
                scope.trace = (trace_id, self._ids.generate_span_id(), parent)
                scope.trace_id = format(trace_id, "032x")  # its trace will be exported: exemplars may point at it
        if self.metrics:
            self.metrics.child(self.metrics.in_flight, route).inc()
        return scope

    def _remote_parent(self, trace_headers: Mapping[str, str]) -> SpanContext | None:
        from opentelemetry.trace import get_current_span
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        if self._propagator is None:
            self._propagator = TraceContextTextMapPropagator()
        context = get_current_span(self._propagator.extract(trace_headers)).get_span_context()
        return context if context.is_valid else None

    def finish(self, scope: RequestScope, status: int, record: RequestRecord, end_perf: float | None = None) -> None:
        """Called when the response is complete (``end_perf``: when it was, if not now). Never raises: telemetry
        must not fail a request."""
        try:
            self._finish(scope, status, record, time.perf_counter() if end_perf is None else end_perf)
        except Exception:  # pragma: no cover - defensive
            log.exception("telemetry could not record a request")

    def _finish(self, scope: RequestScope, status: int, record: RequestRecord, end_perf: float) -> None:
        seconds = end_perf - scope.start_perf
        if record.error is not None and status < 500:
            # A stage that failed after a stream's 200 went out: the client got an error event, not an answer.
            # Counted as the server error it is, so the availability SLI and its alerts see it.
            status = 500
        outcome = request_outcome(status)
        failed = record.failed_stage
        stages = record.stages
        exemplar = {"trace_id": scope.trace_id} if scope.trace_id else None
        if self.metrics:
            m = self.metrics
            m.child(m.in_flight, scope.route).dec()
            m.child(m.requests, scope.route, status_class(status)).inc()
            level = record.result.level if record.result is not None else "none"
            m.child(m.request_duration, scope.route, scope.qps_bucket, outcome, level).observe(seconds, exemplar)
            for stage in stages:
                stage_outcome = "error" if stage.name == failed else "ok"
                m.child(m.stage_duration, stage.name, scope.qps_bucket, stage_outcome).observe(stage.seconds, exemplar)
                if stage.device_seconds is not None:  # GPU-capable stages only (rag.devicetime)
                    m.child(m.stage_device, stage.name, stage.clock).observe(stage.device_seconds, exemplar)
            if failed:
                m.stage_errors.labels(failed).inc()
            result = record.result
            if result:
                m.child(m.cache_requests, result.cache).inc()
            if result and result.quality is not None:  # a cached answer is served again: counted as served
                m.child(m.answer_quality, result.quality.verdict).inc()
                for signal, value in result.quality.values().items():
                    m.child(getattr(m, QUALITY_SIGNAL_FAMILIES[signal]), signal).observe(value, exemplar)
            if result and result.cache != "hit":  # a cached answer ran no retriever, model or support check now
                for retriever, count in result.retrieved.items():
                    m.child(m.retrieved, retriever).observe(count)
                m.child(m.retrieval_routes, result.route).inc()
                for skipped in result.skipped:
                    m.child(m.stage_skipped, skipped).inc()
                if result.generation is not None:
                    m.child(m.generation_ttft).observe(result.generation.ttft_s, exemplar)
                    for gap in result.generation.inter_token_s:
                        m.generation_inter_token.observe(gap)
                if result.support and result.unsupported_sentences:
                    m.unsupported_sentences.inc(result.unsupported_sentences)
                if result.fell_back:
                    m.child(m.generation_degraded, result.degraded_reason).inc()
        if self.otlp_metrics is not None:
            push = self.otlp_metrics.record
            # A traced request's (trace id, request span id) becomes the exemplar, as trace_id does on /metrics.
            traced = scope.trace[:2] if scope.trace_id else None
            push("ragheat.request.duration", seconds,
                 (("route", scope.route), ("qps_bucket", scope.qps_bucket), ("outcome", outcome)), traced)
            for stage in stages:
                push("ragheat.stage.duration", stage.seconds, (("stage", stage.name), ("qps_bucket", scope.qps_bucket),
                                                               ("outcome", "error" if stage.name == failed else "ok")),
                     traced)
        if scope.trace is not None and self.span_processor is not None:
            self._end_spans(scope, status, record, stages, failed, end_perf)

    def _end_spans(self, scope, status, record, stages, failed, end_perf) -> None:
        # Every span of a request ends together, here, so they are built as finished spans and handed over
        # in one call: the SDK's live-span path (sampler, attribute cleaning, context look-ups, processor
        # hooks) costs ~18 µs a span, this ~1.5 µs.
        trace_id, request_span_id, remote_parent = scope.trace
        to_ns = lambda perf: scope.start_ns + int((perf - scope.start_perf) * 1e9)  # noqa: E731
        flags = TraceFlags(TraceFlags.SAMPLED)
        state = remote_parent.trace_state if remote_parent is not None else None
        request_context = SpanContext(trace_id, request_span_id, False, flags, state)
        spans = []
        for stage in stages:
            name, attributes = self._stage_span(stage, record)
            context = SpanContext(trace_id, self._ids.generate_span_id(), False, flags, state)
            events, status_ = (), _UNSET
            if stage.name == failed:
                cause = record.error.cause
                status_ = Status(StatusCode.ERROR, type(cause).__name__)
                events = (Event("exception", {"exception.type": type(cause).__qualname__,
                                              "exception.message": str(cause)}, to_ns(stage.start + stage.seconds)),)
            spans.append(ReadableSpan(
                name=name, context=context, parent=request_context, resource=self.resource, attributes=attributes,
                events=events, kind=SpanKind.INTERNAL, status=status_, instrumentation_scope=self._scope,
                start_time=to_ns(stage.start), end_time=to_ns(stage.start + stage.seconds)))
        attributes = {"http.request.method": "POST", "http.route": scope.route, "rag.qps_bucket": scope.qps_bucket,
                      "http.response.status_code": status}
        if record.top_k is not None:
            attributes["gen_ai.retrieval.top_k"] = record.top_k
        if self.settings.capture_content and record.query is not None:
            attributes["gen_ai.retrieval.query.text"] = record.query
        if self.settings.capture_content and record.result is not None:
            attributes["rag.answer"] = record.result.answer
        if record.result is not None:
            attributes["rag.route"] = record.result.route
            if record.result.quality is not None:
                attributes["rag.quality.verdict"] = record.result.quality.verdict
                attributes.update({f"rag.quality.{k}": v for k, v in record.result.quality.values().items()})
        spans.append(ReadableSpan(
            name=f"POST {scope.route}", context=request_context, parent=remote_parent, resource=self.resource,
            attributes=attributes, kind=SpanKind.SERVER,
            status=Status(StatusCode.ERROR, f"HTTP {status}") if status >= 500 else _UNSET,
            instrumentation_scope=self._scope, start_time=scope.start_ns, end_time=to_ns(end_perf)))
        self.span_processor.add(spans)

    def _stage_span(self, stage: StageTiming, record: RequestRecord) -> tuple[str, dict]:
        attributes: dict = {"rag.stage": stage.name}
        if stage.name.startswith("retrieve_"):
            retriever = stage.name.removeprefix("retrieve_")
            attributes.update({"gen_ai.operation.name": "retrieval", "gen_ai.data_source.id": self.data_source,
                               "rag.retriever": retriever})
            if record.top_k is not None:
                attributes["gen_ai.retrieval.top_k"] = record.top_k
            if record.result is not None:
                attributes["rag.retrieved_documents"] = record.result.retrieved.get(retriever, 0)
                if stage.name in record.result.skipped:  # answered without it: its backend was unavailable
                    attributes.update({"rag.skipped": True, "rag.skipped_reason": record.result.skipped[stage.name]})
            if self.settings.capture_content and record.query is not None:
                attributes["gen_ai.retrieval.query.text"] = record.query
            return f"retrieval {retriever}", attributes
        if stage.name == "embed":
            attributes.update({"gen_ai.operation.name": "embeddings", "gen_ai.request.model": self.model})
            return f"embeddings {self.model}".strip(), attributes
        generation = record.result.generation if record.result is not None else None
        if stage.name in ("generate_prefill", "generate_decode") and generation is not None:
            attributes.update({"gen_ai.operation.name": "chat", "gen_ai.request.model": generation.model,
                               "gen_ai.response.model": generation.model, "rag.generator": record.result.generator})
            if stage.name == "generate_decode":
                attributes["gen_ai.usage.output_tokens"] = generation.output_tokens
            return f"chat {generation.model}".strip() if stage.name == "generate_prefill" else stage.name, attributes
        if stage.name == "generate" and record.result is not None:
            attributes["rag.generator"] = record.result.generator
            if record.result.fell_back:
                attributes.update({"rag.degraded": True, "rag.degraded_reason": record.result.degraded_reason,
                                   "rag.degraded_detail": record.result.degraded_detail or ""})
            if self.settings.capture_content:
                attributes["gen_ai.retrieval.documents"] = json.dumps(
                    [{"id": s.chunk.doc_id, "score": s.score, "text": s.chunk.text} for s in record.result.sources])
        return stage.name, attributes

    # -- lifecycle -----------------------------------------------------------------------------
    def force_flush(self, timeout_s: float = 10.0) -> None:
        if self.span_processor is not None:
            self.span_processor.force_flush(int(timeout_s * 1000))
        if self.otlp_metrics is not None:
            self.otlp_metrics.push()

    def shutdown(self) -> None:
        """Stop exporters without waiting on a dead collector for long."""
        for provider in (self.span_processor, self.otlp_metrics):
            if provider is not None:
                try:
                    provider.shutdown()
                except Exception:  # pragma: no cover - defensive
                    log.exception("telemetry shutdown failed")
