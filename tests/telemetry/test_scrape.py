"""A real server, real queries, real scrapes of ``GET /metrics`` and the spans behind the exemplars."""

from __future__ import annotations

import json
import math
import re
import threading
import time

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from rag.stages import DEFAULT_STAGES, LEVEL_LABELS, QUALITY_SIGNALS, QUALITY_VERDICTS, RETRIEVERS, STAGES
from telemetry.buckets import LATENCY_SECONDS, RETRIEVED_DOCUMENTS
from telemetry.metrics import (DROP_REASONS, EXPECTED_METRICS, QUALITY_SIGNAL_FAMILIES, REQUEST_OUTCOMES, ROUTES,
                               SIGNALS, STAGE_OUTCOMES, specs)
from telemetry_testkit import (QUERIES, children, request_spans, samples, scrape, serve, total, trace_id, wait_for,
                               wait_for_request_spans)

STAGE_H, REQUEST_H = "ragheat_stage_duration_seconds", "ragheat_request_duration_seconds"
HEX32 = re.compile(r"^[0-9a-f]{32}$")


@pytest.fixture(scope="module")
def svc(settings, pipeline):
    with serve(settings, pipeline, exporter=InMemorySpanExporter(), otlp="off", capture_content=False) as s:
        assert s.query(QUERIES[0]).status_code == 200
        yield s


def quiet_scrape(url: str, openmetrics: bool = False):
    """A scrape taken once no request is in flight: every finished request has been recorded."""
    return wait_for(lambda: (lambda f: f if total(f, "ragheat_requests_in_flight") == 0 else None)(
        scrape(url, openmetrics)), 10, what="ragheat_requests_in_flight to return to 0")


def delta(before, after, name, **labels) -> float:
    return total(after, name, **labels) - total(before, name, **labels)


def test_every_expected_metric_is_exposed(svc):
    families = scrape(svc.url)
    # The parser strips _total from counter families; EXPECTED_METRICS lists counters with it.
    names = {f.name + "_total" if f.type == "counter" else f.name for f in families}
    assert [n for n in EXPECTED_METRICS if n not in names] == []
    ours = {n for n in names if n.startswith("ragheat_") and not n.endswith("_created")}
    assert ours == set(EXPECTED_METRICS), "a metric outside the documented contract"
    types = {f.name: f.type for f in families}
    assert types[STAGE_H] == types[REQUEST_H] == types["ragheat_retrieved_documents"] == "histogram"
    assert types["ragheat_requests_in_flight"] == types["ragheat_qps"] == "gauge"
    assert types["ragheat_requests"] == types["ragheat_stage_errors"] == "counter"
    assert types["ragheat_telemetry_dropped"] == "counter"


def test_label_values_come_from_closed_sets(svc):
    svc.query(QUERIES[1], top_k=3)
    svc.query(QUERIES[2], route="/v1/query/stream")
    svc.query("", top_k=3)
    svc.client.post("/v1/query", content=b"{not json", headers={"Content-Type": "application/json"})
    qps = set(svc.telemetry.buckets.labels)
    closed = {
        "stage": set(STAGES), "qps_bucket": qps, "route": set(ROUTES), "retriever": set(RETRIEVERS),
        "status_class": {"1xx", "2xx", "3xx", "4xx", "5xx", "other"}, "signal": set(SIGNALS),
        "reason": set(DROP_REASONS), "quality_level": set(LEVEL_LABELS),
    }
    keys = {STAGE_H: {"stage", "qps_bucket", "outcome"}, REQUEST_H: {"route", "qps_bucket", "outcome", "quality_level"},
            "ragheat_requests": {"route", "status_class"}, "ragheat_requests_in_flight": {"route"},
            "ragheat_qps": set(), "ragheat_retrieved_documents": {"retriever"},
            "ragheat_stage_errors": {"stage"}, "ragheat_telemetry_dropped": {"signal", "reason"}}
    edges = {STAGE_H: [*LATENCY_SECONDS, math.inf], REQUEST_H: [*LATENCY_SECONDS, math.inf],
             "ragheat_retrieved_documents": [*map(float, RETRIEVED_DOCUMENTS), math.inf]}
    for fam in quiet_scrape(svc.url):
        base = fam.name.removesuffix("_created")
        if base not in keys:
            continue
        les: dict[tuple, list] = {}
        for s in fam.samples:
            assert set(s.labels) - {"le"} == keys[base], s
            for key, value in s.labels.items():
                if key == "le":
                    les.setdefault(tuple(sorted(s.labels.items() - {("le", value)})), []).append(float(value))
                elif key == "outcome":
                    assert value in (STAGE_OUTCOMES if base == STAGE_H else REQUEST_OUTCOMES), s
                else:
                    assert value in closed[key], s
        for series, bounds in les.items():  # every histogram series has exactly the shared bucket edges
            assert bounds == edges[base], (base, series)


def test_quality_families_have_closed_labels_and_their_own_buckets(svc):
    """Each signal lands in its scale's family, with that family's bucket edges; verdicts from their closed set."""
    svc.query(QUERIES[1], top_k=3)
    families = {f.name: f for f in quiet_scrape(svc.url)}
    quality = specs("quality")
    for signal, role in QUALITY_SIGNAL_FAMILIES.items():
        spec = quality[role]
        buckets = [float(s.labels["le"]) for s in families[spec.name].samples
                   if s.name.endswith("_bucket") and s.labels["signal"] == signal]
        assert buckets == [*spec.buckets, math.inf], signal
    for role in set(QUALITY_SIGNAL_FAMILIES.values()):
        signals = {s.labels["signal"] for s in families[quality[role].name].samples}
        assert signals == {k for k, v in QUALITY_SIGNAL_FAMILIES.items() if v == role}, role
    verdicts = families[quality["answer_quality"].base_name].samples
    assert {s.labels["verdict"] for s in verdicts} == set(QUALITY_VERDICTS)
    assert all(set(s.labels) == {"verdict"} for s in verdicts)


def test_successful_queries_are_counted_once_per_request_and_stage(svc):
    before, n = quiet_scrape(svc.url), 5
    for i in range(n):
        assert svc.query(QUERIES[i % len(QUERIES)]).status_code == 200
    after = quiet_scrape(svc.url)
    assert delta(before, after, REQUEST_H + "_count", route="/v1/query", outcome="ok") == n
    assert delta(before, after, REQUEST_H + "_count", route="/v1/query/stream") == 0
    assert delta(before, after, "ragheat_requests_total", route="/v1/query", status_class="2xx") == n
    for stage in DEFAULT_STAGES:
        assert delta(before, after, STAGE_H + "_count", stage=stage, outcome="ok") == n, stage
        assert delta(before, after, STAGE_H + "_count", stage=stage, outcome="error") == 0, stage
        assert delta(before, after, STAGE_H + "_sum", stage=stage) > 0, stage
    for retriever in ("dense", "bm25"):  # a default (hybrid) query's retrievers; graph runs only when asked for
        assert delta(before, after, "ragheat_retrieved_documents_count", retriever=retriever) == n
    assert delta(before, after, "ragheat_retrieved_documents_count", retriever="graph") == 0
    # The request took at least as long as its stages together.
    assert delta(before, after, REQUEST_H + "_sum", route="/v1/query") >= delta(before, after, STAGE_H + "_sum")


def test_rejected_requests_add_no_stage_observations(svc):
    before = quiet_scrape(svc.url)
    empty = svc.query("   ")
    too_long = svc.query("x" * 2001)
    assert (empty.status_code, too_long.status_code) == (422, 422), (empty.text, too_long.text)
    after = quiet_scrape(svc.url)
    assert delta(before, after, "ragheat_requests_total", route="/v1/query", status_class="4xx") == 2
    assert delta(before, after, REQUEST_H + "_count", route="/v1/query", outcome="rejected") == 2
    assert delta(before, after, REQUEST_H + "_count", outcome="ok") == 0
    assert delta(before, after, STAGE_H + "_count") == 0
    assert delta(before, after, "ragheat_retrieved_documents_count") == 0
    assert delta(before, after, "ragheat_stage_errors_total") == 0


def test_openmetrics_exemplars_carry_trace_ids_of_exported_spans(svc):
    for q in QUERIES[:3]:
        assert svc.query(q).status_code == 200
    families = quiet_scrape(svc.url, openmetrics=True)
    found: dict[str, set] = {}
    for s in samples(families):
        if s.name in (STAGE_H + "_bucket", REQUEST_H + "_bucket") and s.exemplar is not None:
            assert set(s.exemplar.labels) == {"trace_id"}, s
            assert HEX32.match(s.exemplar.labels["trace_id"]), s
            assert s.exemplar.value <= float(s.labels["le"]), s
            key = s.labels.get("stage") or s.labels["route"]
            found.setdefault(key, set()).add(s.exemplar.labels["trace_id"])
    assert set(DEFAULT_STAGES) | {"/v1/query"} <= set(found), found.keys()

    exporter = svc.exporter

    def spans_by_trace():
        by = {}
        for span in exporter.get_finished_spans():
            by.setdefault(trace_id(span), []).append(span)
        return by if set().union(*found.values()) <= set(by) else None

    by_trace = wait_for(spans_by_trace, 10, what="spans for every exemplar trace id")
    for key, ids in found.items():
        for tid in ids:
            names = {sp.attributes.get("rag.stage") for sp in by_trace[tid]}
            assert key in names or any(sp.name == f"POST {key}" for sp in by_trace[tid]), (key, tid)


def test_one_request_span_with_one_child_per_stage(svc, pipeline):
    exporter, t0 = svc.exporter, time.time_ns()
    responses = [svc.query(q, top_k=k) for q, k in zip(QUERIES[:3], (5, 3, 7))]
    assert all(r.status_code == 200 for r in responses)
    spans = sorted(wait_for_request_spans(exporter, t0, 3), key=lambda s: s.start_time)
    assert len(spans) == 3
    assert len({trace_id(s) for s in spans}) == 3
    source = pipeline.index.manifest["corpus"]["name"]
    for span, response, top_k, text in zip(spans, responses, (5, 3, 7), QUERIES[:3]):
        assert span.kind == SpanKind.SERVER and span.parent is None
        assert span.attributes["http.route"] == "/v1/query"
        assert span.attributes["http.response.status_code"] == 200
        assert span.attributes["rag.qps_bucket"] in svc.telemetry.buckets.labels
        quality = response.json()["quality"]  # the answer's verdict and each signal it computed, on its span too
        assert span.attributes["rag.quality.verdict"] == quality["verdict"] in QUALITY_VERDICTS
        assert {k.removeprefix("rag.quality."): v for k, v in span.attributes.items()
                if k.startswith("rag.quality.") and k != "rag.quality.verdict"} == {
            k: pytest.approx(v, abs=1e-4) for k, v in quality.items() if k in QUALITY_SIGNALS and v is not None}
        kids = sorted(children(exporter, span), key=lambda s: s.start_time)
        assert [k.attributes["rag.stage"] for k in kids] == ["queue", *DEFAULT_STAGES]
        timings = {st["name"]: st["ms"] for st in response.json()["stages"]}
        for kid in kids:
            stage = kid.attributes["rag.stage"]
            assert kid.context.trace_id == span.context.trace_id
            assert kid.parent.span_id == span.context.span_id
            assert span.start_time <= kid.start_time <= kid.end_time <= span.end_time, stage
            assert (kid.end_time - kid.start_time) / 1e6 == pytest.approx(timings[stage], abs=0.01), stage
            assert kid.status.status_code == StatusCode.UNSET
            if stage.startswith("retrieve_"):
                assert kid.attributes["gen_ai.operation.name"] == "retrieval"
                assert kid.attributes["gen_ai.retrieval.top_k"] == top_k
                assert kid.attributes["gen_ai.data_source.id"] == source
            else:
                assert kid.attributes.get("gen_ai.operation.name") != "retrieval"
        # capture_content is off: the query text appears nowhere in the trace.
        for sp in [span, *kids]:
            for value in sp.attributes.values():
                assert text not in str(value) and text.lower()[:30] not in str(value).lower(), (sp.name, value)
            assert "gen_ai.retrieval.query.text" not in sp.attributes
            assert "gen_ai.retrieval.documents" not in sp.attributes and "rag.answer" not in sp.attributes


def test_capture_content_records_the_query(settings, pipeline):
    exporter, text = InMemorySpanExporter(), QUERIES[4]
    with serve(settings, pipeline, exporter=exporter, otlp="off", capture_content=True) as s:
        t0 = time.time_ns()
        response = s.query(text)
        assert response.status_code == 200
        (span,) = wait_for_request_spans(exporter, t0, 1)
        assert span.attributes["gen_ai.retrieval.query.text"] == text
        assert span.attributes["rag.answer"] == response.json()["answer"]
        kids = {k.attributes["rag.stage"]: k for k in children(exporter, span)}
        for stage in ("retrieve_dense", "retrieve_bm25"):
            assert kids[stage].attributes["gen_ai.retrieval.query.text"] == text
        documents = json.loads(kids["generate"].attributes["gen_ai.retrieval.documents"])
        assert [d["id"] for d in documents] == [c["doc_id"] for c in response.json()["citations"]]


def test_a_failing_stage_is_visible_in_metrics_and_spans(svc, pipeline):
    retriever = pipeline.retrievers["bm25"]

    def broken(*args, **kwargs):
        raise RuntimeError("bm25 shard unavailable")

    before, t0 = quiet_scrape(svc.url), time.time_ns()
    retriever.retrieve = broken
    try:
        response = svc.query(QUERIES[3])
    finally:
        del retriever.retrieve  # the class's method again
    assert response.status_code == 500
    assert response.json()["stage"] == "retrieve_bm25" and "retrieve_bm25" in response.json()["reason"]
    after = quiet_scrape(svc.url)
    assert delta(before, after, "ragheat_stage_errors_total", stage="retrieve_bm25") == 1
    assert delta(before, after, "ragheat_stage_errors_total") == 1
    assert delta(before, after, STAGE_H + "_count", stage="retrieve_bm25", outcome="error") == 1
    assert delta(before, after, STAGE_H + "_count", stage="retrieve_bm25", outcome="ok") == 0
    ran_before = DEFAULT_STAGES[:DEFAULT_STAGES.index("retrieve_bm25")]
    for stage in ran_before:  # ran fine before the failure
        assert delta(before, after, STAGE_H + "_count", stage=stage, outcome="ok") == 1, stage
    for stage in ("fuse", "rerank", "generate"):  # never ran
        assert delta(before, after, STAGE_H + "_count", stage=stage) == 0, stage
    assert delta(before, after, REQUEST_H + "_count", route="/v1/query", outcome="error") == 1
    assert delta(before, after, "ragheat_requests_total", route="/v1/query", status_class="5xx") == 1

    (span,) = wait_for_request_spans(svc.exporter, t0, 1)
    assert span.status.status_code == StatusCode.ERROR
    assert span.attributes["http.response.status_code"] == 500
    kids = {k.attributes["rag.stage"]: k for k in children(svc.exporter, span)}
    assert set(kids) == {"queue", *ran_before, "retrieve_bm25"}
    assert kids["retrieve_bm25"].status.status_code == StatusCode.ERROR
    assert any(e.name == "exception" and e.attributes["exception.type"] == "RuntimeError"
               for e in kids["retrieve_bm25"].events)
    assert kids["embed"].status.status_code == StatusCode.UNSET
    assert svc.query(QUERIES[3]).status_code == 200  # the pipeline is whole again


def test_stream_route_is_recorded_under_its_own_label(svc):
    before, t0 = quiet_scrape(svc.url), time.time_ns()
    response = svc.query(QUERIES[5], route="/v1/query/stream")
    assert response.status_code == 200 and "event: done" in response.text
    after = quiet_scrape(svc.url)
    assert delta(before, after, REQUEST_H + "_count", route="/v1/query/stream", outcome="ok") == 1
    assert delta(before, after, REQUEST_H + "_count", route="/v1/query") == 0
    assert delta(before, after, "ragheat_requests_total", route="/v1/query/stream", status_class="2xx") == 1
    for stage in DEFAULT_STAGES:
        assert delta(before, after, STAGE_H + "_count", stage=stage, outcome="ok") == 1, stage
    (span,) = wait_for_request_spans(svc.exporter, t0, 1, route="/v1/query/stream")
    assert span.attributes["http.route"] == "/v1/query/stream"
    assert len(children(svc.exporter, span)) == len(DEFAULT_STAGES) + 1  # and the queue stage
    assert request_spans(svc.exporter, t0, "/v1/query") == []


def test_in_flight_gauge_moves_and_returns_to_zero(svc, pipeline):
    generator, started = pipeline.generator, time.monotonic()
    slow_generate = type(generator).generate

    def slow(*args, **kwargs):
        time.sleep(0.6)
        return slow_generate(generator, *args, **kwargs)

    generator.generate = slow
    try:
        worker = threading.Thread(target=lambda: svc.query(QUERIES[1]))
        worker.start()
        wait_for(lambda: total(scrape(svc.url), "ragheat_requests_in_flight", route="/v1/query") == 1, 5,
                 what="in-flight gauge to show the slow request")
        worker.join()
    finally:
        del generator.generate
    families = quiet_scrape(svc.url)
    for route in ROUTES:
        assert total(families, "ragheat_requests_in_flight", route=route) == 0, route
    # Four requests in the last few seconds: the 10 s window reads at least 0.4 requests/s.
    for q in QUERIES[:3]:
        svc.query(q)
    assert time.monotonic() - started < 9
    assert total(quiet_scrape(svc.url), "ragheat_qps") >= 0.4 - 1e-9


def test_device_time_of_gpu_capable_stages_is_exported_per_request(svc, pipeline):
    """embed and retrieve_dense carry device time (the monotonic fallback on a machine without a GPU);
    no other stage does."""
    from rag.devicetime import CLOCKS
    from telemetry.metrics import SERVICE_METRICS

    device_h = SERVICE_METRICS["stage_device"]
    clocks = {"embed": pipeline.embedder.device_timer.clock,  # "monotonic" here; "cuda" with a GPU
              "retrieve_dense": pipeline.retrievers["dense"].device_timer.clock}
    before, n = quiet_scrape(svc.url), 4
    for i in range(n):
        assert svc.query(QUERIES[i % len(QUERIES)]).status_code == 200
    after = quiet_scrape(svc.url)
    for stage in ("embed", "retrieve_dense"):
        assert delta(before, after, device_h + "_count", stage=stage, clock=clocks[stage]) == n, stage
        device_s, stage_s = (delta(before, after, h + "_sum", stage=stage) for h in (device_h, STAGE_H))
        assert device_s > 0, stage
        if clocks[stage] == "monotonic":  # the wrapped call (model run, index search) is inside its stage
            assert device_s <= stage_s, (stage, device_s, stage_s)
    assert delta(before, after, device_h + "_count") == 2 * n, "only embed and retrieve_dense run GPU-capable work"
    for s in samples(after):
        if s.name.startswith(device_h):
            assert s.labels["clock"] in CLOCKS and s.labels["stage"] in ("embed", "retrieve_dense"), s
