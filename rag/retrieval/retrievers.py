"""The two ``Retriever`` backends: dense (FAISS) and sparse (BM25)."""

from __future__ import annotations

import time

import faiss
import bm25s
import numpy as np

from rag.devicetime import DeviceTimer
from rag.index import dense, sparse
from rag.retrieval.lexical import LexicalAnalyzer
from rag.stages import SEARCH_EFFORTS
from rag.types import Hit, RetrievalResult


class DenseRetriever:
    """Nearest chunks by inner product of normalised embeddings."""

    name = "dense"

    def __init__(self, index: faiss.Index) -> None:
        self.index = index
        self.device_timer = DeviceTimer.for_device(dense.on_gpu(index))  # CUDA events for a GPU index only
        # Each quality level's search parameters, made once (read by concurrent requests, never written).
        self._params = {effort: dense.search_params(index, effort) for effort in SEARCH_EFFORTS}

    def retrieve(self, query: str, query_vector: np.ndarray | None, k: int, *,
                 effort: float = 1.0) -> RetrievalResult:
        if query_vector is None:
            raise ValueError("the dense retriever needs the query embedding")
        start = time.perf_counter()
        params = self._params[effort] if effort in self._params else dense.search_params(self.index, effort)
        (ids, scores), device = self.device_timer.call(dense.search, self.index, query_vector, k,
                                                       params)
        hits = _hits(ids, scores)
        return RetrievalResult(self.name, hits, time.perf_counter() - start, device)


class BM25Retriever:
    """Okapi BM25 (Lucene variant) over the same chunks, with the shared lexical analyser."""

    name = "bm25"

    def __init__(self, model: bm25s.BM25, analyzer: LexicalAnalyzer) -> None:
        self.model = model
        self.analyzer = analyzer

    def retrieve(self, query: str, query_vector: np.ndarray | None, k: int, *,
                 effort: float = 1.0) -> RetrievalResult:
        start = time.perf_counter()  # BM25 scores every posting of the query's terms: no effort to cut
        ids, scores = sparse.bm25_top_k(self.model, self.analyzer.tokens(query), k)
        return RetrievalResult(self.name, _hits(ids, scores), time.perf_counter() - start)


def _hits(ids: np.ndarray, scores: np.ndarray) -> list[Hit]:
    """``Hit``s from a retriever's arrays: ``tolist()`` converts in C, where ``int()``/``float()`` on each numpy scalar
    would be a Python call per value, the larger part of building the list."""
    return list(map(Hit, ids.tolist(), scores.tolist()))
