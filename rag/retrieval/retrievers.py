"""The ``Retriever``s of the dense and BM25 stages: over the index generation's own files (FAISS, bm25s) or over its
collection on a Milvus server (``vector_store.backend``); the same names, stages and signals either way."""

from __future__ import annotations

import dataclasses
import time

import faiss
import bm25s
import numpy as np

from rag.devicetime import DeviceTimer
from rag.index import dense, sparse
from rag.index.milvus import MilvusStore, VectorStoreUnavailable
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


class MilvusDenseRetriever:
    """Nearest chunks by inner product, searched in the generation's Milvus collection. ``ef``: HNSW's search breadth
    at full effort (None: an exact FLAT collection). While the server is down (``VectorStoreUnavailable``) the
    ``fallback`` (the generation's own FAISS index) answers: the same passages, the parity benchmark shows; without
    one the error goes to the pipeline, which answers without this stage."""

    name = "dense"

    def __init__(self, store: MilvusStore, collection: str, ef: int | None, fallback: DenseRetriever | None) -> None:
        self.store, self.collection, self.ef, self.fallback = store, collection, ef, fallback

    def retrieve(self, query: str, query_vector: np.ndarray | None, k: int, *,
                 effort: float = 1.0) -> RetrievalResult:
        if query_vector is None:
            raise ValueError("the dense retriever needs the query embedding")
        start = time.perf_counter()
        ef = None if self.ef is None else max(1, round(self.ef * effort))
        try:
            ids, scores = self.store.dense_search(self.collection, query_vector, k, ef)
        except VectorStoreUnavailable:
            if self.fallback is None:
                raise
            return _instead(self.fallback.retrieve(query, query_vector, k, effort=effort), start)
        return RetrievalResult(self.name, _hits(ids, scores), time.perf_counter() - start)


class MilvusBM25Retriever:
    """BM25 in the generation's Milvus collection, over the terms the shared lexical analyser makes of the query;
    the ``fallback`` (the generation's own bm25s index) answers while the server is down (without one, the error goes
    to the pipeline)."""

    name = "bm25"

    def __init__(self, store: MilvusStore, collection: str, analyzer: LexicalAnalyzer,
                 fallback: BM25Retriever | None) -> None:
        self.store, self.collection, self.analyzer, self.fallback = store, collection, analyzer, fallback

    def retrieve(self, query: str, query_vector: np.ndarray | None, k: int, *,
                 effort: float = 1.0) -> RetrievalResult:
        start = time.perf_counter()
        try:
            ids, scores = self.store.bm25_search(self.collection, self.analyzer.tokens(query), k)
        except VectorStoreUnavailable:
            if self.fallback is None:
                raise
            return _instead(self.fallback.retrieve(query, query_vector, k, effort=effort), start)
        return RetrievalResult(self.name, _hits(ids, scores), time.perf_counter() - start)


def milvus_retrievers(store: MilvusStore, collection: str, ef: int | None, analyzer: LexicalAnalyzer,
                      fallbacks: dict) -> dict:
    """The dense and BM25 retrievers searching ``collection``, each falling back to the retriever of its name in
    ``fallbacks`` (the generation's own files) while the server is down; none there, none used."""
    return {"dense": MilvusDenseRetriever(store, collection, ef, fallback=fallbacks.get("dense")),
            "bm25": MilvusBM25Retriever(store, collection, analyzer, fallback=fallbacks.get("bm25"))}


def _instead(result: RetrievalResult, start: float) -> RetrievalResult:
    """The fallback's result, timed from ``start``: the wait for the server that failed is the stage's too."""
    return dataclasses.replace(result, seconds=time.perf_counter() - start)


def _hits(ids: np.ndarray, scores: np.ndarray) -> list[Hit]:
    """``Hit``s from a retriever's arrays: ``tolist()`` converts in C, where ``int()``/``float()`` on each numpy scalar
    would be a Python call per value, the larger part of building the list."""
    return list(map(Hit, ids.tolist(), scores.tolist()))
