"""What the reranker needs from a query's first stage, recorded while ``RagPipeline.retrieve`` runs unchanged: the
query's token states from the embed stage's own model run, and each retriever's hits. Evaluation (``+rerank``) and
training read the first stage through this, so both see exactly the retrieval that is served."""

from __future__ import annotations

from typing import Sequence

from rag.rerank.features import RerankQuery


class _TokenEmbedder:
    """The pipeline's embedder, asking its one model run for the token states too and keeping them."""

    def __init__(self, inner, recorder: "FirstStageRecorder") -> None:
        self._inner, self._recorder = inner, recorder

    def embed_query(self, text: str):
        result, states = self._inner.embed_query_tokens(text)
        self._recorder.states = states
        return result

    def __getattr__(self, name):
        return getattr(self._inner, name)


class _HitsRetriever:
    def __init__(self, inner, recorder: "FirstStageRecorder") -> None:
        self._inner, self._recorder = inner, recorder
        self.name = inner.name

    def retrieve(self, query, query_vector, k, **options):
        result = self._inner.retrieve(query, query_vector, k, **options)
        self._recorder.hits[self.name] = result.hits
        return result


class FirstStageRecorder:
    """Installs recording wrappers on a pipeline's embedder and retrievers for the ``with`` block (one thread).

    >>> with FirstStageRecorder(pipeline) as recorder:
    ...     fused = pipeline.retrieve(text, 300, ("dense", "bm25"))
    ...     query = recorder.take(text)
    """

    def __init__(self, pipeline) -> None:
        self.pipeline = pipeline
        self.states = None
        self.hits: dict[str, Sequence] = {}

    def __enter__(self) -> "FirstStageRecorder":
        self._saved = (self.pipeline.embedder, self.pipeline.retrievers)
        self.pipeline.embedder = _TokenEmbedder(self.pipeline.embedder, self)
        self.pipeline.retrievers = {n: _HitsRetriever(r, self) for n, r in self.pipeline.retrievers.items()}
        return self

    def __exit__(self, *exc) -> bool:
        self.pipeline.embedder, self.pipeline.retrievers = self._saved
        return False

    def take(self, text: str) -> RerankQuery:
        """The last query's ``RerankQuery``; embeds the query here only when no dense retrieval embedded it."""
        if self.states is None:
            _, self.states = self._saved[0].embed_query_tokens(text)
        query = RerankQuery(self.states, dict(self.hits))
        self.states, self.hits = None, {}
        return query
