"""The whole SciFact corpus as the quality tests index it, from passage vectors kept between runs.

Embedding SciFact's chunks is nearly all of its ingest's time; chunking, BM25 and FAISS are a small part. So the
index is built in every run by this checkout's ingest from vectors kept between runs (tests/kept_vectors.py), and a
change to the ingest, the chunker or the indexes is always what the quality tests measure. What the ingest costs is
measured elsewhere, by a real ingest (tests/rag/test_ingest_cost.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kept_vectors import kept_ingest
from rag.settings import RagheatSettings


@dataclass
class FullIndex:
    path: Path
    manifest: dict
    settings: RagheatSettings  # what it was built with, and is served with


def measured_settings(settings: RagheatSettings) -> RagheatSettings:
    """The quality tests' ingest: what they measure (chunks, embeddings, FAISS, BM25) and nothing else: no token
    vectors for the reranker, no knowledge graph (their retrievers are dense, bm25 and hybrid, unreranked)."""
    return settings.model_copy(update={
        "rerank": settings.rerank.model_copy(update={"enabled": False, "store_tokens": False}),
        "graph": settings.graph.model_copy(update={"enabled": False})})


def build(corpus: Path, index: Path, settings: RagheatSettings, embedder) -> FullIndex:
    """Ingest ``corpus`` into ``index`` with the encoder's outputs kept between runs (tests/kept_vectors.py)."""
    built_with = measured_settings(settings)
    report = kept_ingest("scifact-full", corpus, index, built_with, embedder)
    return FullIndex(index, report.manifest, built_with)
