"""Serve the plain LlamaIndex app, unchanged, traced by OpenInference; ragheat's span processor turns its spans into
the stage histograms at GET /metrics.

    python -m examples.llama_index.serve_otel --port 8012
"""

from __future__ import annotations

import argparse

import uvicorn
from openinference.instrumentation import TraceConfig
from openinference.instrumentation.llama_index import LlamaIndexInstrumentor
from opentelemetry import trace
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.sdk.trace import TracerProvider

import ragheat.observe as rh


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8012)
    args = parser.parse_args()

    # The framework's spans are the traces; ragheat builds none of its own (they would be a second trace of each
    # request, exported beside the first once OTEL_EXPORTER_OTLP_ENDPOINT is set).
    observer = rh.Observer(service="llama-index-rag", routes=("/query",), settings=rh.TelemetrySettings(tracing=False))
    # The SDK's default sampler records every span, so the histograms see every request: sample in the collector,
    # not here. An exporter goes beside ragheat's processor: provider.add_span_processor(BatchSpanProcessor(...)).
    provider = TracerProvider()
    provider.add_span_processor(rh.StageSpanProcessor(observer))
    trace.set_tracer_provider(provider)
    # Spans carry timings, not the question, passages or vectors (OpenInference records them unless told not to).
    LlamaIndexInstrumentor().instrument(tracer_provider=provider, config=TraceConfig(
        hide_inputs=True, hide_outputs=True, hide_embedding_vectors=True))

    from examples.llama_index.app import app  # the plain service, after the instrumentor set LlamaIndex's handlers

    # The HTTP server span is each request's root; scrapes are left untraced so they are not counted as queries.
    FastAPIInstrumentor.instrument_app(app, tracer_provider=provider, excluded_urls="/metrics")
    rh.instrument(app, observer, middleware=False)  # GET /metrics only: the spans time the requests
    uvicorn.run(app, host=args.host, port=args.port)


if __name__ == "__main__":
    main()
