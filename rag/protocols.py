"""The pipeline's contract: one Protocol per stage. Every backend implements the same typed call, and
``RagPipeline`` declares each of its stage attributes by these types, never by a concrete class.

Constructors are cheap and validate; ``warm_up()`` loads models, indexes and clients (Haystack 2 style), so the
FastAPI lifespan decides when the expensive work happens; ``close()`` releases what ``warm_up()`` opened.

The stages that run today: ``Embedder``, ``Retriever``, ``Fuser``, ``Generator`` (extractive, and the fallback),
``StreamingGenerator`` (a language model, token by token), ``SupportCheck``, and for the knowledge graph
``EntityLinker`` (stage ``link_entities``), ``Router`` (stage ``route``: which retrievers run, with which weights) and
``GraphRetriever`` (stage ``retrieve_graph``) over a ``GraphStore`` (the embedded FalkorDB or Neo4j, one Cypher for
both), ``Reranker`` (stage ``rerank``, rag/rerank), ``AnswerCache`` (stage ``cache_lookup``, rag/cache),
``HypotheticalPassageWriter`` (stage ``hyde``) and ``PromptCompressor`` (the passages cut to the prompt's token
budget before the model reads them).
docs/architecture.md says how a new stage plugs in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

from rag.rerank.features import RerankQuery
from rag.types import (CacheKey, CacheStats, Chunk, EmbeddingResult, FusionResult, GenerationResult, Hit,
                       LinkedEntities, QueryResult, RerankResult, RetrievalResult, Route, SentenceSupport)


@runtime_checkable
class Embedder(Protocol):
    """Turns a query into the vector the dense index was built with (and texts into many, at ingest)."""

    @property
    def query_precision(self) -> str: ...  # what queries are embedded at (the passages' may differ)

    @property
    def lone_query_threads(self) -> int: ...  # the threads a query that finds the model to itself runs on

    def warm_up(self) -> None: ...

    def embed_query(self, text: str) -> EmbeddingResult: ...

    def embed_query_tokens(self, text: str) -> tuple[EmbeddingResult, np.ndarray]: ...

    def embed_many(self, texts: Sequence[str], progress=None, on_tokens=None) -> np.ndarray: ...


@runtime_checkable
class Retriever(Protocol):
    """Returns the ``k`` best chunk ids for a query; ``name`` is a closed label (dense, bm25). ``effort``: the share of
    the retriever's configured search effort a request's quality level allows (a retriever without such a knob, an
    exact one, ignores it)."""

    name: str

    def retrieve(self, query: str, query_vector: np.ndarray | None, k: int, *,
                 effort: float = 1.0) -> RetrievalResult: ...


@runtime_checkable
class Fuser(Protocol):
    """Merges several retrievers' rankings into one of ``k`` hits."""

    def fuse(self, results: Sequence[RetrievalResult], k: int) -> FusionResult: ...

    def top_score_range(self, results: Sequence[RetrievalResult]) -> tuple[float, float]:
        """The least and the most the first fused passage of ``results`` can score: first in one list alone, and
        first in every list that has hits."""
        ...


@runtime_checkable
class Generator(Protocol):
    """Writes an answer whose sentences cite ``passages`` by 1-based position."""

    name: str

    def generate(self, query: str, passages: Sequence[Chunk]) -> GenerationResult: ...


@runtime_checkable
class TokenStream(Protocol):
    """The pieces of one streamed answer as they arrive. ``output_tokens`` is the model's count once the stream
    has ended (0 if it sent none) and ``model`` the model that answered; iterate to the end, or ``close()`` to stop
    early (the model's request is aborted)."""

    output_tokens: int
    model: str

    def __iter__(self) -> Iterator[str]: ...

    def close(self) -> None: ...


@runtime_checkable
class StreamingGenerator(Protocol):
    """A language model writing the answer token by token. The pipeline times the stream (``generate_prefill``,
    ``generate_decode``) and falls back to the extractive ``Generator`` when iterating raises
    ``rag.generation.llm.GeneratorUnavailable``. ``metrics_dir`` is where a child process of the generator writes
    its Prometheus metrics for the service to serve (an in-process vLLM engine), or None."""

    name: str
    metrics_dir: Path | None

    def warm_up(self) -> None: ...

    def stream(self, query: str, passages: Sequence[Chunk]) -> TokenStream: ...

    def close(self) -> None: ...


@runtime_checkable
class SupportCheck(Protocol):
    """Scores each sentence of a written answer against the passages it cites (the ``support_check`` stage)."""

    def check(self, answer: str, passages: Sequence[Chunk]) -> tuple[SentenceSupport, ...]: ...


@runtime_checkable
class Reranker(Protocol):
    """Reorders fused candidates (stage ``rerank``); returns at most ``k``. ``query`` carries the query's token states
    from the embed stage's own model run and each retriever's hits, so reranking runs no second transformer pass."""

    name: str

    def warm_up(self) -> None: ...

    def rerank(self, query: RerankQuery, candidates: Sequence[Hit], k: int) -> RerankResult: ...


@runtime_checkable
class GraphStore(Protocol):
    """A Cypher graph database holding the knowledge graph (``name``: falkordb or neo4j). Every backend runs the same
    parameterised statements (``rag.graph.cypher``); nothing user-supplied is ever pasted into Cypher text.
    ``run`` raises ``rag.graph.store.GraphStoreUnavailable`` when the store cannot be reached (down, restarting,
    timed out), so callers can degrade instead of failing; ``restart()`` brings it back (a new child process for
    the embedded store, a new connection for a server); ``healthy()`` is a cheap check, no round trip."""

    name: str

    def warm_up(self) -> None: ...

    def run(self, cypher: str, params: Mapping[str, Any] | None = None, *, write: bool = False) -> list[tuple]: ...

    def healthy(self) -> bool: ...

    def restart(self) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class EntityLinker(Protocol):
    """Finds the knowledge-graph entities a query names (stage ``link_entities``), in process: a gazetteer of title
    aliases, optionally plus the entity titles nearest the query's embedding (``needs_vector``)."""

    needs_vector: bool

    def link(self, query: str, query_vector: np.ndarray | None) -> LinkedEntities: ...


@runtime_checkable
class GraphRetriever(Protocol):
    """Stage ``retrieve_graph``: the chunks reached from the linked entities in the graph store, ranked like any
    retriever's hits (``name`` is ``graph``). Raises ``GraphStoreUnavailable`` when the store is down; the pipeline
    then skips the stage, says the answer is degraded, and the store is restarted (``ready``: not restarting)."""

    name: str

    def retrieve(self, linked: LinkedEntities, k: int) -> RetrievalResult: ...

    def ready(self) -> bool: ...


@runtime_checkable
class AnswerCache(Protocol):
    """Answers already given (stage ``cache_lookup``, rag/cache), looked up by the query's embedding right after the
    embed stage, before retrieval; a miss is ``None``. Thread-safe; bounded; ``stats()`` is read by telemetry."""

    def get(self, key: CacheKey) -> QueryResult | None: ...

    def put(self, key: CacheKey, result: QueryResult) -> None: ...

    def stats(self) -> CacheStats: ...


@runtime_checkable
class Router(Protocol):
    """Stage ``route``: per query, which retrievers run and their fusion weights (one of a closed set of routes), and
    whether the reranker runs, from cheap features of the query and its linked entities. ``rerank``: whether the
    request may rerank at all (a choice with the reranker is not offered when it may not)."""

    def route(self, query: str, linked: LinkedEntities, rerank: bool = True) -> Route: ...


@runtime_checkable
class HypotheticalPassageWriter(Protocol):
    """Stage ``hyde``: a passage that would answer the query, written by the language model, whose embedding drives
    dense retrieval beside the question's own. ``write`` raises ``rag.generation.hyde.HydeSkipped`` (a sentence for
    the answer's ``skipped``) when the model is down, slow or writes nothing usable, never another model error."""

    def write(self, query: str) -> str: ...


@runtime_checkable
class PromptCompressor(Protocol):
    """The passages as the language model's prompt gets them: each cut to its most query-relevant sentences when
    all of them together exceed the prompt's token budget (``generation.prompt_budget_tokens``)."""

    def compress(self, query: str, passages: Sequence[Chunk]) -> list[Chunk]: ...
