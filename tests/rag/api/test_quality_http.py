"""What ``ragheat serve`` exports of each answer's quality (rag/quality) over real HTTP: the response's and the
stream's ``quality``, the verdict counter, the signal histograms and the calibration gauge."""

from __future__ import annotations

import json

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from api_testkit import metric_values, serve_live, with_sections
from rag.pipeline import RagPipeline
from rag.quality.calibration import Calibration
from rag.quality.signals import QUALITY_VERDICTS

OFF_TOPIC = "Which team won the 1998 football World Cup final in Paris?"
CLAIM = "Vitamin D deficiency is associated with bone density loss."


def test_the_service_answers_and_exports_each_answers_quality(settings, subset_index):
    s = with_sections(settings, server={"reload_poll_s": 0}, telemetry={"otlp": "off"},
                      admission={"deadline_ms": 10_000})
    with serve_live(s, RagPipeline(s, subset_index)) as live, \
            httpx.Client(base_url=live.url, timeout=60) as client:
        before = metric_values(client.get("/metrics").text, "ragheat_answer_quality_total", "verdict")
        assert before == dict.fromkeys(QUALITY_VERDICTS, 0.0)  # every verdict is a series from the first scrape
        off = client.post("/v1/query", json={"query": OFF_TOPIC, "top_k": 3}).json()["quality"]
        claim = client.post("/v1/query", json={"query": CLAIM, "top_k": 3}).json()["quality"]
        stream = client.post("/v1/query/stream", json={"query": OFF_TOPIC, "top_k": 3}).text
        done = [json.loads(block.split("data: ", 1)[1]) for block in stream.split("\n\n") if "event: done" in block]
        scrape = client.get("/metrics").text
    assert off["verdict"] == "no_good_passage" and off["best_similarity"] < claim["best_similarity"]
    assert done[0]["quality"]["verdict"] == "no_good_passage"
    after = metric_values(scrape, "ragheat_answer_quality_total", "verdict")
    expected = dict.fromkeys(QUALITY_VERDICTS, 0.0)
    for v in (off["verdict"], claim["verdict"], "no_good_passage"):
        expected[v] += 1
    assert after == expected
    counts = metric_values(scrape, "ragheat_quality_score_count", "signal")
    assert counts["best_similarity"] == 3 and counts["retriever_agreement"] == 3 and counts["answer_support"] == 0
    assert counts["fused_top"] == 3  # hybrid: every answer fused two lists
    assert metric_values(scrape, "ragheat_quality_sentence_citations_count", "signal") == {"citations_per_sentence": 0.0}
    assert metric_values(scrape, "ragheat_quality_rerank_score_count", "signal") == {"rerank_top": 3.0,
                                                                                     "rerank_margin": 3.0}
    thresholds = {sample.labels["signal"]: sample.value for family in text_string_to_metric_families(scrape)
                  for sample in family.samples
                  if sample.name == "ragheat_quality_calibration_score" and sample.labels["point"] == "threshold"}
    # The drift alerts' references: the calibrated similarity, and the support a written answer needs.
    assert thresholds == {"best_similarity": pytest.approx(Calibration.load().min_similarity),
                          "answer_support": pytest.approx(s.quality.min_support)}
