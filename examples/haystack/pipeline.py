"""Hybrid retrieval with Haystack 2: BM25 and MiniLM embeddings over an in-memory store, fused by reciprocal rank.

    embedder (query) -> embedding_retriever --\
                        bm25_retriever -------> joiner (reciprocal_rank_fusion) -> documents
"""

from __future__ import annotations

from haystack import Document, Pipeline
from haystack.components.joiners import DocumentJoiner
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever, InMemoryEmbeddingRetriever
from haystack.components.writers import DocumentWriter
from haystack.document_stores.in_memory import InMemoryDocumentStore
from haystack_integrations.components.embedders.sentence_transformers import (
    SentenceTransformersDocumentEmbedder,
    SentenceTransformersTextEmbedder,
)

from examples._shared import TOP_K, Abstract, Passage, minilm_dir, scifact_abstracts

CANDIDATES = 20  # each retriever's list; the joiner keeps TOP_K


def _embedder_options() -> dict:
    # The local folder, never the hub; vectors normalised so that dot product is cosine similarity.
    return {"model": minilm_dir(), "local_files_only": True, "progress_bar": False, "normalize_embeddings": True}


def index(abstracts: list[Abstract]) -> InMemoryDocumentStore:
    store = InMemoryDocumentStore(embedding_similarity_function="dot_product")
    indexing = Pipeline()
    indexing.add_component("embedder", SentenceTransformersDocumentEmbedder(meta_fields_to_embed=["title"],
                                                                            **_embedder_options()))
    indexing.add_component("writer", DocumentWriter(document_store=store))
    indexing.connect("embedder.documents", "writer.documents")
    indexing.run({"embedder": {"documents": [
        Document(id=a.id, content=a.text, meta={"title": a.title}) for a in abstracts]}})
    return store


def query_pipeline(store: InMemoryDocumentStore) -> Pipeline:
    pipe = Pipeline()
    pipe.add_component("text_embedder", SentenceTransformersTextEmbedder(**_embedder_options()))
    pipe.add_component("embedding_retriever", InMemoryEmbeddingRetriever(document_store=store, top_k=CANDIDATES))
    pipe.add_component("bm25_retriever", InMemoryBM25Retriever(document_store=store, top_k=CANDIDATES))
    pipe.add_component("joiner", DocumentJoiner(join_mode="reciprocal_rank_fusion", top_k=TOP_K))
    pipe.connect("text_embedder.embedding", "embedding_retriever.query_embedding")
    pipe.connect("embedding_retriever", "joiner")
    pipe.connect("bm25_retriever", "joiner")
    pipe.warm_up()
    return pipe


class HybridRetriever:
    """The query pipeline over the indexed SciFact abstracts, built once at start."""

    def __init__(self, abstracts: list[Abstract] | None = None) -> None:
        self.pipeline = query_pipeline(index(abstracts or scifact_abstracts()))

    def run(self, question: str) -> list[Passage]:
        result = self.pipeline.run({"text_embedder": {"text": question}, "bm25_retriever": {"query": question}})
        return [Passage(id=d.id, title=d.meta.get("title", ""), text=d.content or "", score=d.score)
                for d in result["joiner"]["documents"]]
