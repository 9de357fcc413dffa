"""Label-free answer quality (rag/quality): the signals and verdict of one answer, the calibration and its file, and
the pipeline measuring every answer (over HTTP: tests/rag/api/test_quality_http.py)."""

from __future__ import annotations

import pytest

from rag.errors import ConfigurationError
from rag.pipeline import RagPipeline
from rag.quality.calibration import DEFAULT_CALIBRATION, Calibration, CalibrationError, calibrate
from rag.quality.signals import QUALITY_VERDICTS, fused_top, measure, retriever_agreement
from rag.retrieval.fusion import WeightedRRF
from rag.settings import RagheatSettings
from rag.types import Hit, RetrievalResult, SentenceSupport

def with_quality(settings: RagheatSettings, **quality) -> RagheatSettings:
    return settings.model_copy(update={"quality": settings.quality.model_copy(update=quality)})


OFF_TOPIC = "Which team won the 1998 football World Cup final in Paris?"
CLAIM = "Vitamin D deficiency is associated with bone density loss."


def hits(*ids: int, score: float = 1.0) -> list[Hit]:
    return [Hit(i, score - n * 0.1) for n, i in enumerate(ids)]


def sentence(supported: bool) -> SentenceSupport:
    return SentenceSupport("text [1]", (1,), 1.0 if supported else 0.0, supported)


def verdict(**changes) -> str:
    given = dict(best_similarity=0.6, results=(), reranked=None, support=(), fell_back=False, min_similarity=0.4,
                 min_support=0.5)
    return measure(**{**given, **changes}).verdict


def test_each_verdict_and_which_comes_first():
    assert verdict() == "good"
    assert verdict(best_similarity=0.3) == "no_good_passage"
    assert verdict(best_similarity=0.3, fell_back=True) == "no_good_passage"  # nothing to answer from comes first
    assert verdict(fell_back=True) == "fell_back"
    assert verdict(support=[sentence(True), sentence(False), sentence(False)]) == "unsupported"
    assert verdict(support=[sentence(True), sentence(False)]) == "good"  # half supported meets min_support 0.5
    assert verdict(best_similarity=None) == "unscored"
    assert set(QUALITY_VERDICTS) == {"good", "no_good_passage", "fell_back", "unsupported", "unscored"}


def test_signals_read_the_lists_the_request_computed():
    dense = RetrievalResult("dense", hits(*range(10)), 0.0)
    bm25 = RetrievalResult("bm25", hits(5, 6, 7, 20, 21, 22, 23, 24, 25, 26), 0.0)
    assert retriever_agreement([dense, bm25]) == pytest.approx(0.3)
    assert retriever_agreement([dense]) is None and retriever_agreement([bm25]) is None
    two_cited = SentenceSupport("text [1][2]", (1, 2), 1.0, True)
    signals = measure(best_similarity=0.7, results=[dense, bm25], reranked=[Hit(3, 4.5), Hit(1, 3.0)],
                      support=[two_cited, sentence(False)], fell_back=False, min_similarity=0.4, min_support=0.5,
                      fused_top=0.8)
    assert signals.values() == pytest.approx({"best_similarity": 0.7, "retriever_agreement": 0.3, "rerank_top": 4.5,
                                              "rerank_margin": 1.5, "answer_support": 0.5, "fused_top": 0.8,
                                              "citations_per_sentence": 1.5})
    extractive = measure(best_similarity=0.7, results=[dense], reranked=None, support=(), fell_back=False,
                         min_similarity=0.4, min_support=0.5)
    assert extractive.values() == {"best_similarity": 0.7}


def test_fused_top_places_the_first_passage_between_one_list_and_every_list():
    fuser = WeightedRRF({"dense": 1.0, "bm25": 1.0}, k=5)
    dense, bm25 = RetrievalResult("dense", hits(1, 2, 3), 0.0), RetrievalResult("bm25", hits(2, 1, 4), 0.0)
    top = fuser.fuse([dense, bm25], 3).hits[0].score  # 1 and 2: first in one list, second in the other
    assert fused_top(top, fuser, [dense, bm25]) == pytest.approx((1 / 6 + 1 / 7 - 1 / 6) / (2 / 6 - 1 / 6))
    assert fused_top(2 / 6, fuser, [dense, RetrievalResult("bm25", hits(1, 9), 0.0)]) == pytest.approx(1.0)
    empty = RetrievalResult("bm25", [], 0.0)  # BM25 found nothing: no second opinion, no value
    assert fused_top(1 / 6, fuser, [dense, empty]) is None
    assert fused_top(None, fuser, [dense, bm25]) is None and fused_top(top, None, [dense, bm25]) is None


def test_calibration_takes_the_flag_rate_quantile_and_round_trips(tmp_path):
    values = [i / 100 for i in range(100)]
    calibration = calibrate({"best_similarity": values, "retriever_agreement": [0.5] * 100}, flag_rate=0.05,
                            sources=[{"beir": "x"}])
    assert calibration.min_similarity == pytest.approx(0.0495, abs=1e-3)
    assert calibration.reference["best_similarity"]["0.5"] == pytest.approx(0.495, abs=1e-3)
    assert calibration.reference["retriever_agreement"]["0.02"] == 0.5
    calibration.save(tmp_path / "c.json")
    assert Calibration.load(tmp_path / "c.json") == calibration
    with pytest.raises(ValueError, match="at least 20 queries"):
        calibrate({"best_similarity": [0.5] * 5})
    with pytest.raises(ValueError, match="flag_rate"):
        calibrate({"best_similarity": values}, flag_rate=1.5)


def test_the_shipped_calibration_names_its_sets_and_the_command_that_wrote_it():
    shipped = Calibration.load(DEFAULT_CALIBRATION)
    assert 0.0 < shipped.flag_rate < 0.1 and 0.0 < shipped.min_similarity < shipped.reference["best_similarity"]["0.5"]
    assert {s["beir"] for s in shipped.sources if "beir" in s} == {"scifact", "hotpotqa-dev"}
    assert any(s.get("command", "").startswith("ragheat calibrate-quality") for s in shipped.sources)


@pytest.mark.parametrize("content, reason", [(None, "does not exist"), ("{}", "is not a calibration"),
                                             ('{"min_similarity": 3, "flag_rate": 0.02}', "must lie in")])
def test_a_calibration_that_cannot_be_used_is_named(tmp_path, content, reason):
    path = tmp_path / "calibration.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(CalibrationError, match=reason) as info:
        Calibration.load(path)
    assert str(path) in str(info.value)


def test_a_bad_calibration_stops_the_pipeline_at_start(settings, subset_index, tmp_path):
    s = with_quality(settings, calibration=tmp_path / "missing.json")
    with pytest.raises(ConfigurationError, match="quality.calibration: .*missing.json does not exist"):
        RagPipeline(s, subset_index).warm_up()


def test_every_answer_is_measured_and_an_off_topic_question_has_no_good_passage(pipeline):
    off = pipeline.query(OFF_TOPIC, 3).quality
    claim = pipeline.query(CLAIM, 3).quality
    assert off.verdict == "no_good_passage", off
    assert claim.best_similarity > off.best_similarity + 0.1, (claim, off)
    for q in (off, claim):  # hybrid, reranked: every retrieval signal is there; no written answer to support
        assert set(q.values()) == {"best_similarity", "retriever_agreement", "fused_top", "rerank_top",
                                   "rerank_margin"}
        assert 0.0 <= q.retriever_agreement <= 1.0 and q.rerank_margin >= 0.0 and 0.0 <= q.fused_top <= 1.0


def test_quality_off_measures_nothing(settings, subset_index):
    p = RagPipeline(with_quality(settings, enabled=False), subset_index)
    p.warm_up()
    try:
        assert p.query(CLAIM, 3).quality is None
    finally:
        p.close()
