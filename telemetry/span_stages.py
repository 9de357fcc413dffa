"""Spans an instrumented service already emits, turned into ragheat's stage histograms.

An app traced by OpenInference (``openinference-instrumentation-haystack``, ``-llama-index``, ...), OpenLLMetry
(``opentelemetry-instrumentation-langchain``, ``traceloop-sdk``) or OpenLIT needs one set-up call and no change to
its code:

    provider.add_span_processor(rh.StageSpanProcessor(observer))

Each local root span (no parent, or a remote one) is one request, unless it is an HTTP request to a route that is
not among the observer's routes; the spans under it that are a stage are recorded
under the stage label they map to (``span_stage``), with the request's ``qps_bucket`` at its start and its trace id
as the exemplar. A stage span nested in a span of the same label (a fusion retriever's own retrievers are
``retrieve_dense`` and ``retrieve_bm25``; a retriever inside a retriever of the same kind is not) counts once, as the
outer one.

Spans reach processors only when sampled: give the provider a sampler that records every request
(``ParentBased(ALWAYS_ON)``, the SDK's default) and sample at export instead, or the histograms see only the sampled
share of traffic.
"""

from __future__ import annotations

import logging
import threading
import time

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.trace import StatusCode

from rag.errors import StageError
from rag.types import RequestRecord, StageTiming
from telemetry.recorder import RequestScope
from telemetry.stage_names import StageNames

log = logging.getLogger("ragheat.observe")

OPENINFERENCE_KINDS = {"EMBEDDING": "embed", "RERANKER": "rerank", "LLM": "generate", "TOOL": "tool"}
"""``openinference.span.kind`` -> stage (RETRIEVER is refined by name; CHAIN, AGENT, GUARDRAIL, EVALUATOR and
UNKNOWN are the pipeline's structure, not stages: a CHAIN is a stage only when its name says fusion)."""
GENAI_OPERATIONS = {"embeddings": "embed", "rerank": "rerank", "chat": "generate", "text_completion": "generate",
                    "generate_content": "generate", "execute_tool": "tool"}
"""``gen_ai.operation.name`` (OpenTelemetry GenAI conventions) -> stage; ``retrieval`` is refined by name;
``invoke_agent``/``create_agent`` are structure."""
OPENLLMETRY_REQUEST_TYPES = {"chat": "generate", "completion": "generate", "embedding": "embed", "rerank": "rerank"}
"""``llm.request.type`` (OpenLLMetry) -> stage; its ``traceloop.span.kind`` ``task`` spans are stages when their
name says which."""
TTFT_ATTRIBUTES = ("gen_ai.response.time_to_first_chunk", "gen_ai.server.time_to_first_token",
                   "llm.response.time_to_first_token")
"""Time to the first token, in seconds, as the current and the older conventions name it (the first one set)."""
STATUS_ATTRIBUTES = ("http.response.status_code", "http.status_code")  # current, then older HTTP conventions
PATH_ATTRIBUTES = ("http.route", "url.path", "http.target")  # the route template first, then the path itself
MAX_OPEN_REQUESTS = 4096  # requests whose root span has not ended; beyond it the oldest is dropped (and counted)
MAX_SPANS_PER_REQUEST = 2048


def span_stage(span: ReadableSpan, names: StageNames) -> str | None:
    """The stage label ``span`` is recorded under, or None when it is no stage (a chain, an agent, HTTP...)."""
    attributes = span.attributes or {}
    explicit = attributes.get("rag.stage")
    if explicit:
        return names.label(str(explicit))
    kind = attributes.get("openinference.span.kind")
    if kind:
        kind = str(kind).upper()
        if kind == "RETRIEVER":
            return _retriever(span.name, names)
        if kind == "CHAIN":
            return "fuse" if names.label(span.name, count=False) == "fuse" else None
        return OPENINFERENCE_KINDS.get(kind)
    entity = str(attributes.get("traceloop.entity.name") or span.name)
    operation = str(attributes.get("gen_ai.operation.name") or "")
    if "retriev" in operation:  # "retrieval"; OpenLLMetry's "vector_db_retrieve"
        return _retriever(entity, names)
    if operation in GENAI_OPERATIONS:
        return GENAI_OPERATIONS[operation]
    request_type = attributes.get("llm.request.type")
    if request_type:
        return OPENLLMETRY_REQUEST_TYPES.get(str(request_type))
    traceloop_kind = attributes.get("traceloop.span.kind")
    if traceloop_kind == "tool":
        return "tool"
    if traceloop_kind == "task":
        label = names.label(entity, count=False)
        return None if label == "other" else label
    return None


def _retriever(name: str, names: StageNames) -> str:
    label = names.label(name, count=False)
    return label if label.startswith("retrieve") else "retrieve"


class _OpenRequest:
    __slots__ = ("scope", "root_id", "root_start_ns", "spans")

    def __init__(self, scope: RequestScope, root_id: int, root_start_ns: int) -> None:
        self.scope, self.root_id, self.root_start_ns = scope, root_id, root_start_ns
        # span id -> (parent span id, stage label or None, start ns, end ns, failed, ttft seconds or None)
        self.spans: dict[int, tuple] = {}


class StageSpanProcessor(SpanProcessor):
    """Records ragheat's request and stage histograms from finished spans (see the module doc). ``observer``: a
    ``telemetry.observe.Observer`` (its routes, stage names and registry); ``route``: the route label of requests
    whose root span carries no declared ``http.route`` (default the observer's first route)."""

    def __init__(self, observer, route: str | None = None) -> None:
        if route is not None and route not in observer.routes:
            raise ValueError(f"route {route!r} is not one of the observer's routes {observer.routes}")
        self.observer, self.telemetry = observer, observer.telemetry
        self.route = route or observer.routes[0]
        self._open: dict[int, _OpenRequest] = {}  # trace id -> its open request, oldest first
        self._ignored: dict[int, int] = {}  # trace id -> root span id, of requests to routes not observed
        self._lock = threading.Lock()

    def on_start(self, span, parent_context=None) -> None:
        parent = span.parent
        if parent is not None and not parent.is_remote:
            return
        try:
            self._open_request(span)
        except Exception:  # pragma: no cover - a processor must never fail the traced code
            log.exception("ragheat's span processor could not open a request")

    def _open_request(self, span) -> None:
        attributes = span.attributes or {}
        path = next((str(attributes[key]).split("?", 1)[0] for key in PATH_ATTRIBUTES if key in attributes), None)
        if path is not None and path not in self.observer.routes:
            # An HTTP request to a route that is not observed (a health check, a scrape of /metrics): neither it
            # nor any span under it counts.
            context = span.get_span_context()
            with self._lock:
                self._ignored[context.trace_id] = context.span_id
                if len(self._ignored) > MAX_OPEN_REQUESTS:
                    self._ignored.pop(next(iter(self._ignored)))
            return
        scope = self.telemetry.start(path or self.route)
        scope.trace = None  # the app's own spans are the trace: the observer builds none of its own
        context = span.get_span_context()
        if context.trace_flags.sampled:
            scope.trace_id = format(context.trace_id, "032x")
        dropped = None
        with self._lock:
            self._open[context.trace_id] = _OpenRequest(scope, context.span_id, span.start_time or time.time_ns())
            if len(self._open) > MAX_OPEN_REQUESTS:
                dropped = self._open.pop(next(iter(self._open)))
        if dropped is not None:
            self.telemetry._dropped("spans", "queue_full", 1)
            if self.telemetry.metrics:
                self.telemetry.metrics.child(self.telemetry.metrics.in_flight, dropped.scope.route).dec()

    def on_end(self, span: ReadableSpan) -> None:
        try:
            self._end(span)
        except Exception:  # pragma: no cover - a processor must never fail the traced code
            log.exception("ragheat's span processor could not record a span")

    def _end(self, span: ReadableSpan) -> None:
        context = span.get_span_context()
        label = span_stage(span, self.observer.names)
        failed = span.status.status_code is StatusCode.ERROR
        with self._lock:
            ignored_root = self._ignored.get(context.trace_id)
            if ignored_root is not None:
                if ignored_root == context.span_id:
                    del self._ignored[context.trace_id]
                return
            request = self._open.get(context.trace_id)
            if request is not None and context.span_id == request.root_id:
                del self._open[context.trace_id]
        if request is None:
            if label is not None:  # its request's root is not in this process: the stage on its own
                self.observer.record_stage(label, (span.end_time - span.start_time) / 1e9, failed)
            return
        if len(request.spans) < MAX_SPANS_PER_REQUEST:
            ttft = None
            if label == "generate":
                ttft = next((span.attributes[key] for key in TTFT_ATTRIBUTES if key in (span.attributes or {})),
                            None)
            request.spans[context.span_id] = (span.parent.span_id if span.parent else None, label, span.start_time,
                                              span.end_time, failed, ttft)
        if context.span_id == request.root_id:
            self._finish(request, span)

    def _finish(self, request: _OpenRequest, root: ReadableSpan) -> None:
        scope, spans = request.scope, request.spans
        to_perf = lambda ns: scope.start_perf + (ns - request.root_start_ns) / 1e9  # noqa: E731
        stages, failure, ttfts = [], None, []
        for span_id, (parent_id, label, start_ns, end_ns, failed, ttft) in spans.items():  # children end first
            if label is None or self._inside_same_stage(spans, parent_id, label):
                continue
            stages.append(StageTiming(label, (end_ns - start_ns) / 1e9, to_perf(start_ns)))
            if failed and failure is None:
                failure = label
            if ttft is not None:
                ttfts.append(float(ttft))
        attributes = root.attributes or {}
        status = next((int(attributes[key]) for key in STATUS_ATTRIBUTES if key in attributes), None)
        if status is None:
            status = 500 if root.status.status_code is StatusCode.ERROR else 200
        record = RequestRecord(observed=sorted(stages, key=lambda stage: stage.start))
        if failure is not None and status >= 500:
            record.error = StageError(failure, RuntimeError(root.status.description or "the span ended in error"))
        self.telemetry.finish(scope, status, record, end_perf=to_perf(root.end_time))
        metrics = self.telemetry.metrics
        if metrics is not None and ttfts:
            exemplar = {"trace_id": scope.trace_id} if scope.trace_id else None
            for seconds in ttfts:
                metrics.child(metrics.generation_ttft).observe(seconds, exemplar)

    @staticmethod
    def _inside_same_stage(spans: dict, parent_id: int | None, label: str) -> bool:
        seen = 0
        while parent_id is not None and parent_id in spans and seen < MAX_SPANS_PER_REQUEST:
            parent_id, parent_label = spans[parent_id][0], spans[parent_id][1]
            if parent_label == label:
                return True
            seen += 1
        return False

    def shutdown(self) -> None:
        with self._lock:
            self._open.clear()
            self._ignored.clear()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
