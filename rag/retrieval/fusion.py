"""Weighted reciprocal-rank fusion: score(c) = sum over retrievers r of w_r / (k + rank_r(c)).

RRF needs no score calibration between BM25 and cosine similarity, which is why it is the
default; the weights let one retriever count more (tuned on SciFact train, docs/benchmarks.md).
"""

from __future__ import annotations

import heapq
import time
from itertools import starmap
from typing import Mapping, Sequence

from rag.types import FusionResult, Hit, RetrievalResult


class WeightedRRF:
    """The ``Fuser``: weighted reciprocal-rank fusion, score = sum of weight / (k + rank)."""

    name = "rrf"

    def __init__(self, weights: Mapping[str, float], k: float = 60.0) -> None:
        if not k > 0:  # also rejects NaN
            raise ValueError(f"k must be greater than 0. Currently, the k is {k}")
        if any(not w >= 0 for w in weights.values()):  # also rejects NaN
            raise ValueError(f"weights must not be negative: {dict(weights)}")
        self.weights = dict(weights)
        self.k = k

    def fuse(self, results: Sequence[RetrievalResult], k: int) -> FusionResult:
        start = time.perf_counter()
        scores: dict[int, float] = {}
        get = scores.get
        for result in results:
            weight = self.weights.get(result.retriever, 1.0)
            for rank, hit in enumerate(result.hits, 1):
                chunk_id = hit.chunk_id
                scores[chunk_id] = get(chunk_id, 0.0) + weight / (self.k + rank)
        # Ties (same fused score) keep a stable order by chunk id so results are reproducible; only the top k
        # become Hits (heapq.nsmallest: no full sort of every candidate).
        ranked = heapq.nsmallest(k, scores.items(), key=lambda item: (-item[1], item[0]))
        return FusionResult(list(starmap(Hit, ranked)), time.perf_counter() - start)

    def top_score_range(self, results: Sequence[RetrievalResult]) -> tuple[float, float]:
        # The first passage scores at least what the heaviest list's first passage gets from that list alone.
        weights = [self.weights.get(r.retriever, 1.0) for r in results if r.hits]
        return (max(weights, default=0.0) / (self.k + 1), sum(weights) / (self.k + 1))
