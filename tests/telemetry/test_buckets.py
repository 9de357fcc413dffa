"""The shared bucket sets are a contract with the dashboards and the SLO rules: a literal snapshot here makes
every change deliberate, and a real scrape shows the histograms use exactly these edges."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rag.slo import SLO_SECONDS
from telemetry.buckets import (BUCKET_SETS, KERNEL_LOG2_SECONDS, LATENCY_SECONDS, RETRIEVED_DOCUMENTS, VLLM_STEP_BLOCKS,
                               VLLM_STEP_TOKENS)
from telemetry.metrics import PrometheusMetrics
from telemetry.qps import QpsBuckets

LATENCY_SNAPSHOT = (
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075,
    0.01, 0.015, 0.02, 0.03, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.38,
    0.4, 0.42, 0.45, 0.5, 0.6, 0.75,
    1.0, 1.5, 2.5, 5.0, 10.0,
)
RETRIEVED_SNAPSHOT = (0, 1, 2, 3, 5, 10, 20, 50, 100, 200, 500, 1000)
KERNEL_LOG2_SNAPSHOT = (
    1e-06, 2e-06, 4e-06, 8e-06, 1.6e-05, 3.2e-05, 6.4e-05, 0.000128,
    0.000256, 0.000512, 0.001024, 0.002048, 0.004096, 0.008192, 0.016384, 0.032768,
    0.065536, 0.131072, 0.262144, 0.524288, 1.048576, 2.097152, 4.194304, 8.388608,
)


def test_latency_edges_match_the_snapshot():
    assert tuple(LATENCY_SECONDS) == LATENCY_SNAPSHOT
    assert len(LATENCY_SECONDS) == 30


def test_retrieved_documents_edges_match_the_snapshot():
    assert tuple(RETRIEVED_DOCUMENTS) == RETRIEVED_SNAPSHOT


def test_kernel_log2_edges_match_the_snapshot():
    assert tuple(KERNEL_LOG2_SECONDS) == KERNEL_LOG2_SNAPSHOT


VLLM_STEP_TOKENS_SNAPSHOT = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
VLLM_STEP_BLOCKS_SNAPSHOT = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
UNIT_SCORES_SNAPSHOT = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85,
                        0.9, 0.95, 1.0)
RERANK_SCORES_SNAPSHOT = (0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 8.0)
PER_SENTENCE_SNAPSHOT = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0)


def test_vllm_step_edges_match_the_snapshot():
    assert VLLM_STEP_TOKENS == VLLM_STEP_TOKENS_SNAPSHOT
    assert VLLM_STEP_BLOCKS == VLLM_STEP_BLOCKS_SNAPSHOT


def test_bucket_sets_hold_the_snapshots_under_their_names():
    """The names the dashboards look bucket sets up by, each against the literal snapshot (not against the
    module's own constants, which would only compare the table with itself)."""
    assert {name: tuple(edges) for name, edges in BUCKET_SETS.items()} == {
        "latency_seconds": LATENCY_SNAPSHOT, "retrieved_documents": RETRIEVED_SNAPSHOT,
        "kernel_log2_seconds": KERNEL_LOG2_SNAPSHOT, "vllm_step_tokens": VLLM_STEP_TOKENS_SNAPSHOT,
        "vllm_step_blocks": VLLM_STEP_BLOCKS_SNAPSHOT, "unit_scores": UNIT_SCORES_SNAPSHOT,
        "rerank_scores": RERANK_SCORES_SNAPSHOT, "per_sentence": PER_SENTENCE_SNAPSHOT}


def test_slo_is_an_exact_latency_edge():
    assert SLO_SECONDS == 0.42
    # Exact float equality: the SLI is read off le="0.42" with no interpolation.
    assert any(edge == SLO_SECONDS for edge in LATENCY_SECONDS)
    assert LATENCY_SECONDS.index(SLO_SECONDS) == LATENCY_SNAPSHOT.index(0.42)


@pytest.mark.parametrize("edges", [LATENCY_SECONDS, RETRIEVED_DOCUMENTS, KERNEL_LOG2_SECONDS, VLLM_STEP_TOKENS,
                                   VLLM_STEP_BLOCKS], ids=["latency", "retrieved", "kernel", "tokens", "blocks"])
def test_edges_are_finite_and_strictly_increasing(edges):
    assert all(math.isfinite(e) for e in edges)
    assert all(b > a for a, b in zip(edges, edges[1:]))


def test_latency_range_and_dense_band_around_the_slo():
    assert LATENCY_SECONDS[0] == 0.0005
    assert LATENCY_SECONDS[-1] == 10.0
    band = [e for e in LATENCY_SECONDS if 0.3 <= e <= 0.5]
    assert len(band) >= 6, band
    # Both neighbours of the objective are close to it: the heatmap resolves the tail around 420 ms.
    i = LATENCY_SECONDS.index(SLO_SECONDS)
    assert LATENCY_SECONDS[i + 1] - LATENCY_SECONDS[i - 1] <= 0.05 + 1e-12


def test_retrieved_documents_start_at_zero():
    # "Nothing matched" must be its own bucket (le="0").
    assert RETRIEVED_DOCUMENTS[0] == 0


def _bucket_edges(text: str, family: str) -> dict[tuple, list[float]]:
    """``le`` edges of each series of a histogram family, in exposition order, keyed by the other labels."""
    edges: dict[tuple, list[float]] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name != family:
            continue
        for s in fam.samples:
            if s.name == family + "_bucket":
                key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
                edges.setdefault(key, []).append(float(s.labels["le"]))
    return edges


def test_scraped_histograms_use_exactly_these_edges():
    registry = CollectorRegistry()
    labels = QpsBuckets([1.0, 10.0, 50.0, 200.0]).labels
    metrics = PrometheusMetrics(registry, labels)
    metrics.stage_duration.labels("embed", labels[0], "ok").observe(0.42)
    metrics.request_duration.labels("/v1/query", labels[0], "ok", "full").observe(0.0004)
    metrics.retrieved.labels("bm25").observe(0)
    text = generate_latest(registry).decode()

    for family in ("ragheat_stage_duration_seconds", "ragheat_request_duration_seconds"):
        series = _bucket_edges(text, family)
        assert series, f"{family} has no bucket series in the scrape"
        for key, les in series.items():
            assert les == [*LATENCY_SNAPSHOT, math.inf], (family, key)
    retrieved = _bucket_edges(text, "ragheat_retrieved_documents")
    assert set(k for key in retrieved for k, _ in key) == {"retriever"}
    for key, les in retrieved.items():
        assert les == [*(float(e) for e in RETRIEVED_SNAPSHOT), math.inf], key
    # The SLO edge is exposed as the literal le="0.42", and an observation of exactly 0.42 s counts as within it.
    assert 'ragheat_stage_duration_seconds_bucket{le="0.42",outcome="ok",qps_bucket="0-1",stage="embed"} 1.0' in text
    assert 'ragheat_stage_duration_seconds_bucket{le="0.4",outcome="ok",qps_bucket="0-1",stage="embed"} 0.0' in text
