"""Head sampling and W3C trace-context propagation, on a real server."""

from __future__ import annotations

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from rag.stages import DEFAULT_STAGES
from telemetry_testkit import scrape, serve


def _exemplar_trace_ids(url: str) -> set[str]:
    ids = set()
    for family in scrape(url, openmetrics=True):
        for sample in family.samples:
            if sample.exemplar is not None:
                ids.add(sample.exemplar.labels["trace_id"])
    return ids


def test_ratio_zero_traces_nothing_and_attaches_no_exemplars(settings, pipeline):
    exporter = InMemorySpanExporter()
    with serve(settings, pipeline, exporter=exporter, trace_sample_ratio=0.0) as served:
        for _ in range(5):
            assert served.query("vitamin D and bone density").status_code == 200
        served.telemetry.force_flush()
        assert exporter.get_finished_spans() == ()
        assert _exemplar_trace_ids(served.url) == set()


def test_partial_ratio_traces_a_share_and_exemplars_point_at_traced_requests(settings, pipeline):
    exporter = InMemorySpanExporter()
    with serve(settings, pipeline, exporter=exporter, trace_sample_ratio=0.5) as served:
        for _ in range(60):
            assert served.query("aspirin and heart attacks").status_code == 200
        served.telemetry.force_flush()
        requests = [s for s in exporter.get_finished_spans() if s.name == "POST /v1/query"]
        assert 10 <= len(requests) <= 50  # binomial(60, 0.5): far outside this means the ratio is ignored
        traced = {format(s.context.trace_id, "032x") for s in requests}
        exemplars = _exemplar_trace_ids(served.url)
        assert exemplars and exemplars <= traced


def test_traceparent_continues_the_callers_trace(settings, pipeline):
    exporter = InMemorySpanExporter()
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    with serve(settings, pipeline, exporter=exporter, trace_sample_ratio=0.0) as served:
        response = served.client.post("/v1/query", json={"query": "gene expression"},
                                      headers={"traceparent": f"00-{trace_id}-{parent_id}-01"})
        assert response.status_code == 200
        # A caller that did not sample: neither do we.
        served.client.post("/v1/query", json={"query": "gene expression"},
                           headers={"traceparent": f"00-{'1' * 32}-{parent_id}-00"})
        served.telemetry.force_flush()
        spans = exporter.get_finished_spans()
        request = [s for s in spans if s.name == "POST /v1/query"]
        assert len(request) == 1
        assert format(request[0].context.trace_id, "032x") == trace_id
        assert format(request[0].parent.span_id, "016x") == parent_id
        assert all(format(s.context.trace_id, "032x") == trace_id for s in spans)
        assert len(spans) == 1 + 1 + len(DEFAULT_STAGES)  # the request, its queue wait and its stages
