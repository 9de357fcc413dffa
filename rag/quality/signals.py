"""Label-free signals of one answer's quality, measured on every request from what the pipeline computed anyway:

- ``best_similarity``: the cosine of the query's embedding with the closest passage the dense retriever found (the
  question's own search, before a hypothetical passage is fused in). Traffic the corpus does not cover, and an index
  whose vectors no longer match the query encoder, both push it down.
- ``retriever_agreement``: the share of the dense retriever's top ten chunks that BM25's top ten also holds.
- ``fused_top``: where the first fused passage's score lies between the least it can be (first in one list alone)
  and the most (first in every list the request fused): 0 when no other list puts it first, 1 when every one does.
- ``rerank_top`` and ``rerank_margin``: the reranker's score of the first passage, and its lead over the second.
- ``answer_support``: the share of a written answer's sentences the support check accepted.
- ``citations_per_sentence``: the citation markers a written answer's sentences carry, per sentence.

Each is None where the request did not compute it (no dense search, no second retriever, fewer than two lists with
hits fused, no reranking, an extractive answer). The verdict (``QUALITY_VERDICTS``) is what the quality SLO counts:
``no_good_passage`` when the best similarity lies below the calibrated threshold (``rag.quality.calibration``),
``fell_back`` when a language model's answer was replaced by the extractive one, ``unsupported`` when fewer than
``min_support`` of a written answer's sentences are supported, ``unscored`` when there is no similarity to judge by
(no dense search ran), else ``good``.
The signals cost a few microseconds: a set intersection and some subtractions.
"""

from __future__ import annotations

from typing import Sequence

from rag.stages import (BAD_VERDICTS, JUDGE_OUTCOMES, PER_SENTENCE_SIGNALS, QUALITY_SIGNALS, QUALITY_VERDICTS,
                        RERANK_SIGNALS, UNIT_SIGNALS)
from rag.types import Hit, QualitySignals, RetrievalResult, SentenceSupport, Verdict

__all__ = ["BAD_VERDICTS", "JUDGE_OUTCOMES", "PER_SENTENCE_SIGNALS", "QUALITY_SIGNALS", "QUALITY_VERDICTS",
           "RERANK_SIGNALS", "UNIT_SIGNALS",
           "QualityMeter", "QualitySignals", "Verdict", "measure", "of_context", "retrieval_signals"]

AGREEMENT_DEPTH = 10


def retriever_agreement(results: Sequence[RetrievalResult], depth: int = AGREEMENT_DEPTH) -> float | None:
    """Share of the dense top ``depth`` that BM25's top ``depth`` also holds; None unless both ran."""
    lists = {r.retriever: r.hits for r in results}
    dense, bm25 = lists.get("dense"), lists.get("bm25")
    if not dense or bm25 is None:
        return None
    top = {h.chunk_id for h in dense[:depth]}
    return len(top.intersection(h.chunk_id for h in bm25[:depth])) / min(depth, len(dense))


def answer_support(support: Sequence[SentenceSupport]) -> float | None:
    """Share of a written answer's sentences the support check accepted; None for an extractive answer."""
    return sum(s.supported for s in support) / len(support) if support else None


def fused_top(score: float | None, fuser, results: Sequence[RetrievalResult]) -> float | None:
    """The first fused passage's ``score`` placed between the least and the most it can be (``Fuser.top_score_range``),
    0..1; None unless at least two lists with hits were fused."""
    if score is None or fuser is None:
        return None
    low, high = fuser.top_score_range(results)
    if high - low <= 1e-9 * high:  # one list with hits: nothing to agree with
        return None
    return min(1.0, max(0.0, (score - low) / (high - low)))


def citations_per_sentence(support: Sequence[SentenceSupport]) -> float | None:
    """Citation markers per sentence of a written answer; None for an extractive answer."""
    return sum(len(s.citations) for s in support) / len(support) if support else None


def measure(*, best_similarity: float | None, results: Sequence[RetrievalResult], reranked: Sequence[Hit] | None,
            support: Sequence[SentenceSupport], fell_back: bool, min_similarity: float,
            min_support: float, fused_top: float | None = None) -> QualitySignals:
    """The signals of one answer and its verdict. ``reranked``: the reranker's top hits (its scores), None when the
    request was not reranked; ``min_similarity``/``min_support``: the calibrated threshold and the least supported
    share of a written answer; ``fused_top``: ``fused_top()``'s value, None when not fused."""
    top = reranked[0].score if reranked else None
    margin = reranked[0].score - reranked[1].score if reranked and len(reranked) > 1 else None
    supported = answer_support(support)
    if best_similarity is not None and best_similarity < min_similarity:
        verdict: Verdict = "no_good_passage"
    elif fell_back:
        verdict = "fell_back"
    elif supported is not None and supported < min_support:
        verdict = "unsupported"
    elif best_similarity is None:
        verdict = "unscored"
    else:
        verdict = "good"
    return QualitySignals(verdict, best_similarity, retriever_agreement(results), top, margin, supported, fused_top,
                          citations_per_sentence(support))


def of_context(context, *, min_similarity: float, support: Sequence[SentenceSupport] = (), fell_back: bool = False,
               min_support: float = 0.0) -> QualitySignals:
    """``measure`` of what a request ``context`` (``rag.query_context``) retrieved, with its written answer's
    ``support`` when it has one."""
    return measure(best_similarity=context.best_similarity, results=context.results, reranked=context.reranked,
                   support=support, fell_back=fell_back, min_similarity=min_similarity, min_support=min_support,
                   fused_top=fused_top(context.fused_top_score, context.fuser, context.results))


class QualityMeter:
    """Measures each answer's signals against one threshold (the calibration's, or ``quality.min_similarity``)."""

    def __init__(self, min_similarity: float, min_support: float, calibration=None) -> None:
        self.min_similarity, self.min_support = min_similarity, min_support
        self.calibration = calibration  # rag.quality.calibration.Calibration, None when the threshold was set alone

    @classmethod
    def from_settings(cls, quality) -> "QualityMeter":
        """From ``QualitySettings``; ``CalibrationError`` naming the file when its calibration cannot be read."""
        from rag.quality.calibration import Calibration

        calibration = Calibration.load(quality.calibration)
        threshold = calibration.min_similarity if quality.min_similarity is None else quality.min_similarity
        return cls(threshold, quality.min_support, calibration)

    def measure(self, context, generation) -> QualitySignals:
        """The signals of the answer ``generation`` gave to the request ``context`` (``rag.query_context``)."""
        return of_context(context, min_similarity=self.min_similarity, support=generation.support,
                          fell_back=generation.degraded_reason is not None, min_support=self.min_support)


def retrieval_signals(pipeline, texts: Sequence[str], k: int = 10, advance=None) -> list:
    """Each query's ``QualitySignals`` as the served pipeline retrieves for it (its default retrievers, reranked when
    it reranks); answers are not written, so ``answer_support`` stays unset. ``pipeline``: a warmed-up
    ``rag.pipeline.RagPipeline``; ``advance``: called after each query (a progress bar)."""
    threshold = pipeline.quality.min_similarity if pipeline.quality is not None else -1.0
    found = []
    for text in texts:
        context = pipeline.retrieve(text, k)
        found.append(of_context(context, min_similarity=threshold))
        if advance is not None:
            advance()
    return found
