"""Spans as OpenInference, OpenLLMetry and the GenAI conventions shape them, through the SDK, into stage histograms."""

from __future__ import annotations

import time

import pytest
from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags, set_span_in_context
from prometheus_client import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

import ragheat.observe as rh

KIND = "openinference.span.kind"


@pytest.fixture
def traced():
    observer = rh.Observer(service="traced-rag", routes=("/query", "/chat"),
                           settings=rh.TelemetrySettings(tracing=False, otlp="off"), environ={})
    provider = TracerProvider()
    provider.add_span_processor(rh.StageSpanProcessor(observer))
    yield observer, provider.get_tracer("an.instrumentation")
    provider.shutdown()


def families(observer) -> dict:
    text = openmetrics_latest(observer.registry).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def counts(observer, family="ragheat_stage_duration_seconds", label="stage") -> dict:
    found = {}
    for s in families(observer)[family].samples:
        if s.name.endswith("_count") and s.value:
            key = (s.labels[label], s.labels.get("outcome"))
            found[key] = found.get(key, 0) + s.value
    return found


def test_an_openinference_trace_becomes_one_request_and_its_stages(traced):
    observer, tracer = traced
    with tracer.start_as_current_span("Pipeline.run", attributes={KIND: "CHAIN"}) as root:
        with tracer.start_as_current_span("SentenceTransformersTextEmbedder", attributes={KIND: "EMBEDDING"}):
            time.sleep(0.002)
        with tracer.start_as_current_span("QueryFusionRetriever", attributes={KIND: "RETRIEVER"}):
            with tracer.start_as_current_span("VectorIndexRetriever", attributes={KIND: "RETRIEVER"}):
                pass
            with tracer.start_as_current_span("BM25Retriever", attributes={KIND: "RETRIEVER"}):
                with tracer.start_as_current_span("BM25Retriever._retrieve", attributes={KIND: "RETRIEVER"}):
                    pass  # inside a retriever of the same label: counted once, as the outer one
        with tracer.start_as_current_span("DocumentJoiner", attributes={KIND: "CHAIN"}):
            pass
        with tracer.start_as_current_span("OpenAIChatGenerator",
                                          attributes={KIND: "LLM", "gen_ai.server.time_to_first_token": 0.031}):
            pass
        trace_id = format(root.get_span_context().trace_id, "032x")
    assert counts(observer) == {("embed", "ok"): 1, ("retrieve", "ok"): 1, ("retrieve_dense", "ok"): 1,
                                ("retrieve_bm25", "ok"): 1, ("fuse", "ok"): 1, ("generate", "ok"): 1}
    assert counts(observer, "ragheat_request_duration_seconds", "route") == {("/query", "ok"): 1}
    found = families(observer)
    exemplars = [s.exemplar for s in found["ragheat_stage_duration_seconds"].samples if s.exemplar]
    assert exemplars and {e.labels["trace_id"] for e in exemplars} == {trace_id}
    ttft = [s for s in found["ragheat_generation_ttft_seconds"].samples if s.name.endswith("_sum")]
    assert ttft[0].value == pytest.approx(0.031)
    embed_sum = [s.value for s in found["ragheat_stage_duration_seconds"].samples
                 if s.name.endswith("_sum") and s.labels["stage"] == "embed"]
    assert embed_sum[0] >= 0.002  # the span's own duration


def test_genai_and_openllmetry_names_and_a_server_span_with_its_route(traced):
    observer, tracer = traced
    with tracer.start_as_current_span("POST /chat", kind=SpanKind.SERVER,
                                      attributes={"http.route": "/chat", "http.response.status_code": 200}):
        with tracer.start_as_current_span("embeddings all-MiniLM", attributes={"gen_ai.operation.name": "embeddings"}):
            pass
        with tracer.start_as_current_span("retrieval faiss", attributes={"gen_ai.operation.name": "retrieval"}):
            pass
        with tracer.start_as_current_span("execute_tool search", attributes={"gen_ai.operation.name": "execute_tool"}):
            pass
        with tracer.start_as_current_span("ChatOpenAI.chat", attributes={"llm.request.type": "chat"}):
            pass
        with tracer.start_as_current_span("BM25Retriever.langchain.task", attributes={"traceloop.span.kind": "task"}):
            pass
        with tracer.start_as_current_span("format_prompt.task", attributes={"traceloop.span.kind": "task"}):
            pass  # a task no name places: structure, not a stage
        with tracer.start_as_current_span("invoke_agent", attributes={"gen_ai.operation.name": "invoke_agent"}):
            pass
    assert counts(observer) == {("embed", "ok"): 1, ("retrieve_dense", "ok"): 1, ("tool", "ok"): 1,
                                ("generate", "ok"): 1, ("retrieve_bm25", "ok"): 1}
    assert counts(observer, "ragheat_request_duration_seconds", "route") == {("/chat", "ok"): 1}
    unmapped = [s.value for s in families(observer)["ragheat_unmapped_stage_names"].samples if s.name.endswith("_total")]
    assert unmapped == [0]  # names guessed from spans are not the caller's: never counted as unmapped


def test_a_failed_stage_span_fails_its_request_and_is_named(traced):
    observer, tracer = traced
    with pytest.raises(RuntimeError):
        with tracer.start_as_current_span("Pipeline.run", attributes={KIND: "CHAIN"}):
            with tracer.start_as_current_span("BM25Retriever", attributes={KIND: "RETRIEVER"}):
                raise RuntimeError("index gone")
    assert counts(observer) == {("retrieve_bm25", "error"): 1}
    errors = {s.labels["stage"]: s.value for s in families(observer)["ragheat_stage_errors"].samples
              if s.name.endswith("_total") and s.value}
    assert errors == {"retrieve_bm25": 1}
    text = generate_latest(observer.registry).decode()
    assert 'ragheat_requests_total{route="/query",status_class="5xx"} 1.0' in text


def test_a_span_continuing_a_remote_trace_is_the_request_and_stray_stages_still_count(traced):
    observer, tracer = traced
    remote = SpanContext(0x1234, 0x5678, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    with tracer.start_as_current_span("rag", context=set_span_in_context(NonRecordingSpan(remote), Context())):
        with tracer.start_as_current_span("rerank", attributes={KIND: "RERANKER"}):
            pass
    assert counts(observer) == {("rerank", "ok"): 1}
    exemplars = [s.exemplar for s in families(observer)["ragheat_stage_duration_seconds"].samples if s.exemplar]
    assert {e.labels["trace_id"] for e in exemplars} == {format(0x1234, "032x")}
    # A stage whose request root is not in this process (its parent is local but unknown): recorded on its own.
    local = SpanContext(0x9999, 0x1111, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    tracer.start_span("embed", context=set_span_in_context(NonRecordingSpan(local), Context()),
                      attributes={KIND: "EMBEDDING"}).end()
    assert counts(observer)[("embed", "ok")] == 1


def test_unsampled_spans_never_reach_the_processor(traced):
    observer, _ = traced
    provider = TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(rh.StageSpanProcessor(observer))
    tracer = provider.get_tracer("sampled.out")
    with tracer.start_as_current_span("Pipeline.run", attributes={KIND: "CHAIN"}):
        with tracer.start_as_current_span("BM25Retriever", attributes={KIND: "RETRIEVER"}):
            pass
    assert counts(observer) == {}  # why the module doc asks for a sampler that records every request


def test_the_processor_refuses_an_undeclared_route_and_bounds_open_requests(traced, monkeypatch):
    observer, tracer = traced
    with pytest.raises(ValueError, match="routes"):
        rh.StageSpanProcessor(observer, route="/elsewhere")
    import telemetry.span_stages as span_stages

    monkeypatch.setattr(span_stages, "MAX_OPEN_REQUESTS", 3)
    spans = [tracer.start_span(f"request {i}", attributes={KIND: "CHAIN"}) for i in range(5)]  # never ended
    dropped = {s.labels["reason"]: s.value for s in families(observer)["ragheat_telemetry_dropped"].samples
               if s.name.endswith("_total") and s.labels["signal"] == "spans"}
    assert dropped["queue_full"] == 2
    in_flight = sum(s.value for s in families(observer)["ragheat_requests_in_flight"].samples)
    assert in_flight == 3
    for span in spans:
        span.set_status(Status(StatusCode.OK))
        span.end()
    assert sum(s.value for s in families(observer)["ragheat_requests_in_flight"].samples) == 0


def test_openllmetry_retriever_spans_and_unobserved_routes():
    observer = rh.Observer(service="langchain-rag", routes=("/query",), environ={},
                           settings=rh.TelemetrySettings(tracing=False, otlp="off"))
    provider = TracerProvider()
    provider.add_span_processor(rh.StageSpanProcessor(observer))
    tracer = provider.get_tracer("opentelemetry.instrumentation.langchain")
    with tracer.start_as_current_span("GET /metrics", kind=SpanKind.SERVER, attributes={"http.route": "/metrics"}):
        with tracer.start_as_current_span("ChatModel", attributes={"llm.request.type": "chat"}):
            pass  # not a request of a declared route: neither it nor its stages count
    with tracer.start_as_current_span("POST /query", kind=SpanKind.SERVER, attributes={"http.target": "/query?x=1"}):
        with tracer.start_as_current_span("EnsembleRetriever.langchain.task", attributes={
                "gen_ai.operation.name": "vector_db_retrieve", "traceloop.span.kind": "task",
                "traceloop.entity.name": "EnsembleRetriever"}):
            with tracer.start_as_current_span("BM25Retriever.langchain.task", attributes={
                    "gen_ai.operation.name": "vector_db_retrieve", "traceloop.span.kind": "task",
                    "traceloop.entity.name": "BM25Retriever"}):
                pass
    assert counts(observer) == {("retrieve", "ok"): 1, ("retrieve_bm25", "ok"): 1}
    assert counts(observer, "ragheat_request_duration_seconds", "route") == {("/query", "ok"): 1}


def test_the_processor_adds_no_trace_of_its_own():
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    observer = rh.Observer(service="traced", routes=("/query",), span_exporter=exporter, environ={},
                           settings=rh.TelemetrySettings(trace_sample_ratio=1.0, otlp="off"))
    provider = TracerProvider()
    provider.add_span_processor(rh.StageSpanProcessor(observer))
    with provider.get_tracer("t").start_as_current_span("Pipeline.run", attributes={KIND: "CHAIN"}):
        with provider.get_tracer("t").start_as_current_span("BM25Retriever", attributes={KIND: "RETRIEVER"}):
            pass
    observer.telemetry.force_flush()
    assert counts(observer) == {("retrieve_bm25", "ok"): 1} and exporter.get_finished_spans() == ()
