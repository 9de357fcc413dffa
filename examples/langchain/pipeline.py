"""Hybrid retrieval with LangChain: a FAISS vector store over MiniLM embeddings and a BM25Retriever over the same
documents, fused by an EnsembleRetriever (weighted reciprocal rank fusion).

LangChain 1.x keeps ``EnsembleRetriever`` in ``langchain-classic``; the BM25 retriever and FAISS store come from
``langchain-community``.
"""

from __future__ import annotations

from langchain_classic.retrievers import EnsembleRetriever
from langchain_community.retrievers import BM25Retriever
from langchain_community.vectorstores import FAISS
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings

from examples._shared import TOP_K, Abstract, Passage, minilm_dir, scifact_abstracts

CANDIDATES = 20  # each retriever's list; the service keeps the first TOP_K fused


class MiniLMEmbeddings(Embeddings):
    """all-MiniLM-L6-v2 from the local folder through sentence-transformers: LangChain's ``Embeddings`` interface."""

    def __init__(self, model_dir: str | None = None) -> None:
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(model_dir or minilm_dir(), device="cpu", local_files_only=True)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.model.encode(texts, normalize_embeddings=True, show_progress_bar=False).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]


def build(abstracts: list[Abstract]) -> EnsembleRetriever:
    docs = [Document(id=a.id, page_content=a.text, metadata={"id": a.id, "title": a.title}) for a in abstracts]
    dense = FAISS.from_documents(docs, MiniLMEmbeddings()).as_retriever(search_kwargs={"k": CANDIDATES})
    bm25 = BM25Retriever.from_documents(docs, k=CANDIDATES)
    # id_key: the fusion tells documents apart by their id rather than by their whole text.
    return EnsembleRetriever(retrievers=[dense, bm25], weights=[0.5, 0.5], id_key="id")


class HybridRetriever:
    """The ensemble retriever over the indexed SciFact abstracts, built once at start."""

    def __init__(self, abstracts: list[Abstract] | None = None) -> None:
        self.retriever = build(abstracts or scifact_abstracts())

    def run(self, question: str) -> list[Passage]:
        # EnsembleRetriever returns every fused document, best first, without its fused score.
        return [Passage(id=d.metadata["id"], title=d.metadata.get("title", ""), text=d.page_content)
                for d in self.retriever.invoke(question)[:TOP_K]]
