"""Hybrid retrieval with LlamaIndex: a VectorStoreIndex over MiniLM embeddings and a BM25Retriever over the same
nodes, fused by a QueryFusionRetriever in reciprocal-rerank mode.

``num_queries=1`` asks for no generated query variants, so the fusion retriever never calls its language model; it
is given a ``MockLLM`` so that LlamaIndex does not resolve its default (OpenAI) one.
"""

from __future__ import annotations

from typing import Any

from llama_index.core import VectorStoreIndex
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.llms import MockLLM
from llama_index.core.retrievers import QueryFusionRetriever
from llama_index.core.schema import TextNode
from llama_index.retrievers.bm25 import BM25Retriever
from pydantic import PrivateAttr

from examples._shared import TOP_K, Abstract, Passage, minilm_dir, scifact_abstracts

CANDIDATES = 20  # each retriever's list; the fusion keeps TOP_K


class MiniLMEmbedding(BaseEmbedding):
    """all-MiniLM-L6-v2 from the local folder through sentence-transformers: LlamaIndex's custom-embedding seam."""

    _model: Any = PrivateAttr()

    def __init__(self, model_dir: str | None = None, **kwargs: Any) -> None:
        super().__init__(model_name="all-MiniLM-L6-v2", **kwargs)
        from sentence_transformers import SentenceTransformer

        self._model = SentenceTransformer(model_dir or minilm_dir(), device="cpu", local_files_only=True)

    def _encode(self, texts: list[str]) -> list[list[float]]:
        return self._model.encode(texts, normalize_embeddings=True, show_progress_bar=False).tolist()

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._encode([query])[0]

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._get_query_embedding(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._encode([text])[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return self._encode(texts)


def build(abstracts: list[Abstract]) -> QueryFusionRetriever:
    # One node per abstract: the abstracts are short enough that chunking would only split sentences apart.
    nodes = [TextNode(id_=a.id, text=a.text, metadata={"title": a.title}) for a in abstracts]
    index = VectorStoreIndex(nodes, embed_model=MiniLMEmbedding())
    return QueryFusionRetriever(
        [index.as_retriever(similarity_top_k=CANDIDATES),
         BM25Retriever.from_defaults(nodes=nodes, similarity_top_k=CANDIDATES)],
        llm=MockLLM(),
        mode="reciprocal_rerank",
        num_queries=1,
        similarity_top_k=TOP_K,
        use_async=False,  # the service calls it from a worker thread; the retrievers themselves are synchronous
    )


class HybridRetriever:
    """The fusion retriever over the indexed SciFact abstracts, built once at start."""

    def __init__(self, abstracts: list[Abstract] | None = None) -> None:
        self.retriever = build(abstracts or scifact_abstracts())

    def run(self, question: str) -> list[Passage]:
        return [Passage(id=n.node.node_id, title=n.node.metadata.get("title", ""), text=n.node.get_content(),
                        score=n.score)
                for n in self.retriever.retrieve(question)]
