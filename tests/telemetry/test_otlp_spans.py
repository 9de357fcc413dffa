"""ragheat's direct OTLP span encoder must produce exactly what the OpenTelemetry SDK's encoder produces."""

from __future__ import annotations

import random

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from telemetry.otlp_spans import SpanWireEncoder, traces_endpoint_from_env

RESOURCE = Resource.create({"service.name": "ragheat", "service.version": "0.1.0"})
OTHER_RESOURCE = Resource({"service.name": "other"}, schema_url="https://opentelemetry.io/schemas/1.21.0")
SCOPE = InstrumentationScope("ragheat", "0.1.0")
OTHER_SCOPE = InstrumentationScope("other", None, "https://opentelemetry.io/schemas/1.21.0")


def context(rng, trace_id=None, remote=False, state=None) -> SpanContext:
    return SpanContext(trace_id or rng.getrandbits(128), rng.getrandbits(64), remote, TraceFlags(1), state)


def varied_spans(rng: random.Random) -> list[ReadableSpan]:
    spans = []
    for i in range(40):
        trace_id = rng.getrandbits(128)
        parent = None if i % 4 == 0 else context(rng, trace_id, remote=i % 3 == 0)
        state = TraceState([("vendor", f"v{i}")]) if i % 5 == 0 else None
        attributes = {"rag.stage": ["embed", "retrieve_dense", "fuse"][i % 3], "gen_ai.retrieval.top_k": i,
                      "ratio": i / 7, "negative": -i, "flag": i % 2 == 0, "tags": ("a", "b", str(i)),
                      "text": "naïve ünïcode " * (i % 9), "big": 2 ** 62 + i}
        events = ()
        status = Status(StatusCode.UNSET)
        if i % 6 == 1:
            events = (Event("exception", {"exception.type": "ValueError", "exception.message": f"bad {i}"},
                            1_700_000_000_000_000_000 + i),)
            status = Status(StatusCode.ERROR, f"ValueError {i}")
        elif i % 6 == 2:
            status = Status(StatusCode.OK)
        links = (Link(context(rng), {"link.n": i}),) if i % 7 == 0 else ()
        spans.append(ReadableSpan(
            name=f"stage {i % 3}", context=context(rng, trace_id, state=state), parent=parent,
            resource=OTHER_RESOURCE if i % 10 == 9 else RESOURCE, attributes=attributes if i % 8 else {},
            events=events, links=links, kind=list(SpanKind)[i % len(SpanKind)], status=status,
            instrumentation_scope=OTHER_SCOPE if i % 11 == 10 else SCOPE,
            start_time=1_700_000_000_000_000_000 + i * 1000, end_time=1_700_000_000_000_000_000 + i * 1000 + 999))
    return spans


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_wire_encoding_equals_the_sdk_encoding(seed):
    spans = varied_spans(random.Random(seed))
    encoder = SpanWireEncoder()
    for _ in range(2):  # the second pass is served from the encoder's caches
        decoded = ExportTraceServiceRequest()
        decoded.ParseFromString(encoder.export_request(spans))
        assert decoded == encode_spans(spans)


def test_equal_values_of_different_types_are_not_confused_by_the_caches():
    rng, encoder = random.Random(4), SpanWireEncoder()
    spans = [ReadableSpan(name="s", context=context(rng), resource=RESOURCE, attributes={"v": value},
                          instrumentation_scope=SCOPE, start_time=1, end_time=2) for value in (1, True, 1.0, 1)]
    decoded = ExportTraceServiceRequest()
    decoded.ParseFromString(encoder.export_request(spans))
    assert decoded == encode_spans(spans)


def test_endpoint_follows_the_standard_variables():
    assert traces_endpoint_from_env({}) == "http://localhost:4318/v1/traces"
    assert traces_endpoint_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}) == "http://c:4318/v1/traces"
    assert traces_endpoint_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
                                     "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t/x"}) == "http://t/x"


def test_headers_are_url_decoded_as_the_spec_says():
    from telemetry.otlp_metrics import headers_from_env
    from telemetry.otlp_spans import traces_headers_from_env

    env = {"OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20abc, x-tenant=a%2Cb"}
    assert traces_headers_from_env(env) == headers_from_env(env) == {"authorization": "Bearer abc", "x-tenant": "a,b"}
    assert traces_headers_from_env({**env, "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "k=v"}) == {"k": "v"}
