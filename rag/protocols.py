"""One Protocol per pipeline stage. Every backend implements the same typed call.

Constructors are cheap and validate; ``warm_up()`` loads models and indexes (Haystack 2 style),
so the FastAPI lifespan decides when the expensive work happens.
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from rag.types import Chunk, EmbeddingResult, FusionResult, GenerationResult, RetrievalResult


@runtime_checkable
class Embedder(Protocol):
    def warm_up(self) -> None: ...

    def embed_query(self, text: str) -> EmbeddingResult: ...

    def embed_many(self, texts: Sequence[str], progress=None) -> np.ndarray: ...


@runtime_checkable
class Retriever(Protocol):
    """Returns the ``k`` best chunk ids for a query; ``name`` is a closed label (dense, bm25)."""

    name: str

    def retrieve(self, query: str, query_vector: np.ndarray | None, k: int) -> RetrievalResult: ...


@runtime_checkable
class Fuser(Protocol):
    def fuse(self, results: Sequence[RetrievalResult], k: int) -> FusionResult: ...


@runtime_checkable
class Generator(Protocol):
    """Writes an answer whose sentences cite ``passages`` by 1-based position."""

    name: str

    def generate(self, query: str, passages: Sequence[Chunk]) -> GenerationResult: ...
