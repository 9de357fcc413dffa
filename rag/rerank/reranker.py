"""``LateInteractionReranker``: the ``rerank`` stage. The top ``candidates`` fused hits are rescored by the head's
combination of MaxSim (query token vectors against the stored document token vectors) with their first-stage
scores; hits past ``candidates`` keep their fused order after them. No torch: the head's projection and, for int8
vectors (the default) and product codes (decoded to int8), MaxSim's product run on ONNX Runtime; fp16 vectors take
numpy's float product."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from rag.rerank.features import RerankQuery, candidate_features
from rag.rerank.head import DEFAULT_HEAD, RerankHead
from rag.rerank.maxsim import Int8MaxSim, limit_blas_threads, maxsim
from rag.rerank.store import TokenVectors, load_token_vectors
from rag.types import Hit, RerankResult

log = logging.getLogger(__name__)


class LateInteractionReranker:
    """ColBERT-style late interaction over an index generation's stored token vectors.

    >>> reranker = load_reranker(index.folder, index.manifest)
    >>> reranker.rerank(RerankQuery(states, {"dense": dense_hits, "bm25": bm25_hits}), fused.hits, k=10)
    """

    name = "late_interaction"

    def __init__(self, head: RerankHead, vectors: TokenVectors, candidates: int = 50,
                 float_product: bool = False) -> None:
        """``float_product``: numpy's float32 product even over int8 vectors (the reference the integer product is
        compared with: docs/benchmarks.md, "Late-interaction reranker: what it costs")."""
        if candidates < 1:
            raise ValueError(f"candidates must be greater than 0. Currently, the candidates is {candidates}")
        self.head, self.vectors, self.candidates = head, vectors, candidates
        self._int8 = Int8MaxSim() if vectors.integer and not float_product else None

    def warm_up(self, memory: str = "default") -> None:
        """Bring the memory-mapped token vectors into memory and run the scoring path once (the head's and the
        product's ONNX sessions allocate on their first run), so that the first queries do not pay for either.
        ``memory``: ``placement.memory``; ``hugepages`` moves the vectors into memory advised for huge pages."""
        if memory == "hugepages":
            self.vectors.move_to_huge_pages()
        elif not self.vectors.prefault() and self.vectors.codes.nbytes:
            log.warning("rerank: the token vectors (%.1f GiB) exceed half the available memory and are not read in "
                        "at warm-up; the first queries will read them from disk", self.vectors.codes.nbytes / 2**30)
        if len(self.vectors):
            states = np.ones((4, self.head.hidden), np.float32)
            self.scores(RerankQuery(states, {}), [Hit(0, 1.0), Hit(len(self.vectors) - 1, 0.5)])

    def scores(self, query: RerankQuery, candidates: Sequence[Hit]) -> np.ndarray:
        """The combined score of each candidate (all of them, however many)."""
        projected = self.head.project(query.token_states)
        ids = [h.chunk_id for h in candidates]
        if self._int8 is not None:
            similarity = self._int8(self.vectors.query_space(projected), *self.vectors.gather_codes(ids))
        else:
            similarity = maxsim(self.vectors.query_space(projected), *self.vectors.gather(ids))
        return self.head.combine(candidate_features(similarity, candidates, query.first_stage))

    def rerank(self, query: RerankQuery, candidates: Sequence[Hit], k: int) -> RerankResult:
        start = time.perf_counter()
        top, rest = list(candidates[: self.candidates]), list(candidates[self.candidates:])
        if not top:
            return RerankResult([], time.perf_counter() - start)
        scores = self.scores(query, top)
        order = np.argsort(-scores, kind="stable")  # ties keep the fused order
        hits = [Hit(top[i].chunk_id, float(scores[i])) for i in order] + rest
        return RerankResult(hits[:k], time.perf_counter() - start)


def load_reranker(folder: Path, manifest: dict, head_path: Path | None = None,
                  candidates: int = 50, float_product: bool = False) -> LateInteractionReranker:
    """The reranker for the generation in ``folder``: its head (``DEFAULT_HEAD`` unless named) and stored token
    vectors; ``IndexLoadError`` when the generation has none or they were projected by another head."""
    limit_blas_threads()  # MaxSim's product on the request's own thread (rag/rerank/maxsim.py says why)
    head = RerankHead.load(head_path or DEFAULT_HEAD)
    vectors = load_token_vectors(folder, manifest.get("rerank"), head, manifest["counts"]["chunks"])
    return LateInteractionReranker(head, vectors, candidates, float_product)
