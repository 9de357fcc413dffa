"""Haystack, LlamaIndex and LangChain services that ragheat did not write, each served twice as a live process:
with ``ragheat.observe``'s few lines (form i) and under its framework's OpenTelemetry instrumentation feeding
``StageSpanProcessor`` (form ii). Each answers POST /query and shows ragheat's stage histograms at /metrics."""

from __future__ import annotations

import ast
import re
import time
from pathlib import Path

import pytest

from examples_live import REPO, STAGE_H, forms  # tests/examples/examples_live.py, beside this file

EXAMPLES = REPO / "examples"
TRACE_ID = re.compile(r"^[0-9a-f]{32}$")
EXPECTED_STAGES = {
    # form (i) sees the components through the framework's own hook (rh.haystack/llama_index/langchain.enable);
    # form (ii) sees the components the instrumentor traces
    "haystack": {"ragheat": {"embed", "retrieve_dense", "retrieve_bm25", "fuse"},
                 "otel": {"embed", "retrieve_dense", "retrieve_bm25", "fuse"}},
    # QueryFusionRetriever's own span is `retrieve`; its fusion runs inside it, untraced
    "llama_index": {"ragheat": {"embed", "retrieve_dense", "retrieve_bm25", "retrieve"},
                    "otel": {"embed", "retrieve_dense", "retrieve_bm25", "retrieve"}},
    # the retrievers' callbacks (the Embeddings class emits no callback, so no embed stage)
    "langchain": {"ragheat": {"retrieve_dense", "retrieve_bm25", "retrieve"},
                  "otel": {"retrieve_dense", "retrieve_bm25", "retrieve"}},
}
CLAIMS = 6


@pytest.fixture(scope="module", params=sorted(EXPECTED_STAGES))
def framework(request, tmp_path_factory, claims, otlp_receiver):
    services = forms(request.param, tmp_path_factory, otlp_receiver)
    try:
        # Every form answers the same claims first, so each scrape below has seen traced requests.
        answers = {form: [service.query(claim.text) for claim in claims[:CLAIMS]]
                   for form, service in services.items()}
        yield request.param, services, answers
    finally:
        for service in services.values():
            service.stop()


def imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


@pytest.mark.parametrize("name", sorted(EXPECTED_STAGES))
def test_plain_service_is_not_ragheats(name):
    """app.py, its pipeline and the shared glue import nothing of ragheat; serve_otel imports app.py unchanged."""
    for path in (EXAMPLES / name / "app.py", EXAMPLES / name / "pipeline.py", EXAMPLES / "__init__.py",
                 EXAMPLES / "_shared" / "__init__.py"):
        ours = {m for m in imported_modules(path) if m.split(".")[0] in ("ragheat", "rag", "telemetry")}
        assert not ours, f"{path.relative_to(REPO)} imports {sorted(ours)}"
    assert f"examples.{name}.app" in imported_modules(EXAMPLES / name / "serve_otel.py")


@pytest.mark.parametrize("form", ["ragheat", "otel"])
def test_query_answers_from_the_fused_passages(framework, form, claims):
    name, _, answers = framework
    found = 0
    for claim, body in zip(claims, answers[form]):
        documents = body["documents"]
        assert 0 < len(documents) <= 5
        assert all(isinstance(d["id"], str) and d["text"] for d in documents)
        assert body["answer"] == documents[0]["text"]  # extractive: the best fused passage
        found += bool(claim.relevant & {d["id"] for d in documents})
    # Hybrid retrieval over a small corpus finds most claims' abstracts in its top 5.
    assert found >= CLAIMS // 2, f"{name} {form}: {found} of {CLAIMS} claims found their abstract"


@pytest.mark.parametrize("form", ["ragheat", "otel"])
def test_text_scrape_has_the_stages(framework, form):
    name, services, _ = framework
    samples = [s for family in services[form].scrape() for s in family.samples if s.name == STAGE_H + "_count"]
    stages = {s.labels["stage"] for s in samples if s.value > 0}
    assert stages >= EXPECTED_STAGES[name][form], f"{name} {form} shows {sorted(stages)}"
    assert all(s.labels.get("qps_bucket") for s in samples)
    requests = [s for family in services[form].scrape() for s in family.samples
                if s.name == "ragheat_request_duration_seconds_count" and s.labels.get("route") == "/query"]
    assert sum(s.value for s in requests) >= CLAIMS


@pytest.mark.parametrize("form", ["ragheat", "otel"])
def test_openmetrics_scrape_has_exemplars(framework, form, otlp_receiver):
    name, services, _ = framework
    buckets = [s for family in services[form].scrape(openmetrics=True) for s in family.samples
               if s.name == STAGE_H + "_bucket" and s.exemplar is not None]
    traced = {s.labels["stage"] for s in buckets if TRACE_ID.match(s.exemplar.labels.get("trace_id", ""))}
    assert traced >= EXPECTED_STAGES[name][form], f"{name} {form}: exemplars on {sorted(traced)}"
    if form == "ragheat":
        # ragheat exports the traces its exemplars name (in batches: give the exporter a moment)
        wanted = {s.exemplar.labels["trace_id"] for s in buckets}
        deadline = time.monotonic() + 10
        while not wanted <= (exported := {span.trace_id.hex() for span in otlp_receiver.spans()}):
            assert time.monotonic() < deadline, f"exemplar traces not exported: {sorted(wanted - exported)}"
            time.sleep(0.2)
