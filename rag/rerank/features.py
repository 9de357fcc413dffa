"""What the reranker reads besides token vectors: the first stage's own scores per candidate, so the final score is
a learned combination (``RerankHead.combine``) and MaxSim corrects the fused order instead of replacing it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from rag.types import Hit


@dataclass(frozen=True)
class RerankQuery:
    """The query as the reranker sees it: its token states (tokens, hidden) from the embed stage's single model
    run, and each retriever's hits (retriever name -> hits, best first), whose scores become features."""

    token_states: np.ndarray
    first_stage: Mapping[str, Sequence[Hit]]


def candidate_features(maxsim: np.ndarray, candidates: Sequence[Hit],
                       first_stage: Mapping[str, Sequence[Hit]]) -> np.ndarray:
    """(candidates, 4) in ``rag.rerank.head.FEATURES`` order. Scores are made comparable across queries: fused and
    BM25 over the list's best; dense cosines as they are. A candidate a retriever did not return gets that
    retriever's worst returned score (dense: it is at most that close) or 0 (BM25, fused)."""
    n = len(candidates)
    out = np.zeros((n, 4), np.float32)
    out[:, 0] = maxsim
    fused = np.array([h.score for h in candidates], np.float32)
    out[:, 1] = fused / fused.max() if n and fused.max() > 0 else 0.0
    dense = {h.chunk_id: h.score for h in first_stage.get("dense", ())}
    floor = min(dense.values()) if dense else 0.0
    out[:, 2] = [dense.get(h.chunk_id, floor) for h in candidates]
    bm25 = {h.chunk_id: h.score for h in first_stage.get("bm25", ())}
    top = max(bm25.values()) if bm25 else 0.0
    out[:, 3] = [bm25.get(h.chunk_id, 0.0) / top if top > 0 else 0.0 for h in candidates]
    return out
