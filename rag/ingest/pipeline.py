"""``ragheat ingest``: source -> chunks -> embeddings + BM25 -> a new index generation, swapped in atomically."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

from rag import __version__
from rag.embedding.embedder import OnnxEmbedder
from rag.index import dense, sparse
from rag.index.store import CHUNKS, IndexWriter, read_manifest, write_chunks
from rag.errors import IndexLoadError
from rag.ingest.chunking import SemanticDensityChunker, TokenWindowChunker
from rag.ingest.sources import Corpus, load_source
from rag.retrieval.lexical import LexicalAnalyzer
from rag.settings import RagheatSettings
from rag.types import Chunk


@dataclass
class IngestReport:
    """What an ingest did: the manifest, the generation folder, and whether it was skipped as up to date."""

    index_dir: Path
    generation: Path | None  # None when the index was already up to date
    manifest: dict
    skipped: bool


def passage_text(chunk: Chunk) -> str:
    """What is embedded and BM25-indexed for a chunk: its title gives the passage its subject."""
    return f"{chunk.title}\n{chunk.text}" if chunk.title else chunk.text


def make_chunker(settings: RagheatSettings, embedder: OnnxEmbedder):
    """The chunker the ``chunking`` settings name, over ``embedder``'s tokenizer."""
    c = settings.chunking
    if c.strategy == "semantic":
        return SemanticDensityChunker(embedder.tokenizer, embedder.embed_many, c.semantic_threshold,
                                      c.min_tokens, c.max_tokens, budget=settings.embedding.max_seq_length - 2)
    return TokenWindowChunker(embedder.tokenizer, c.window_tokens, c.overlap_tokens,
                              budget=settings.embedding.max_seq_length - 2)


class _Steps:
    """Optional rich progress: one task per step, advanced by the step itself."""

    def __init__(self, progress) -> None:
        self.progress = progress

    def start(self, description: str, total: int | None):
        if self.progress is None:
            return lambda n=1: None
        task = self.progress.add_task(description, total=total)
        return lambda n=1: self.progress.advance(task, n)


def ingest(source: str, index_dir: Path, settings: RagheatSettings, *, embedder: OnnxEmbedder | None = None,
           force: bool = False, progress=None) -> IngestReport:
    """Build (or confirm up to date) the index for ``source`` in ``index_dir``."""
    started = time.perf_counter()
    steps = _Steps(progress)
    timings: dict[str, float] = {}
    embedder = embedder or OnnxEmbedder(settings.embedding)
    embedder.warm_up()
    analyzer = LexicalAnalyzer(settings.retrieval.stemmer)

    t = time.perf_counter()
    corpus = load_source(source)
    timings["read"] = time.perf_counter() - t
    chunker = make_chunker(settings, embedder)
    r = settings.retrieval
    config = {
        "model": embedder.identity(),
        "chunking": chunker.params(),
        "lexical": {**analyzer.params(), "bm25": {"k1": r.bm25_k1, "b": r.bm25_b, "method": "lucene"}},
        "dense_settings": settings.index.model_dump(include={"kind", "hnsw_m", "hnsw_ef_construction",
                                                             "ivf_nlist", "pq_m", "pq_nbits"}),
    }
    fingerprint = _fingerprint(corpus, config)
    if not force:
        try:
            current = read_manifest(index_dir)
            if current.get("fingerprint") == fingerprint:
                return IngestReport(Path(index_dir), None, current, skipped=True)
        except IndexLoadError:
            pass  # nothing usable there yet: build

    with IndexWriter.open(Path(index_dir)) as writer:
        t = time.perf_counter()
        advance = steps.start(f"chunk ({chunker.name})", len(corpus.documents))
        chunks: list[Chunk] = []
        batch = 512
        for offset in range(0, len(corpus.documents), batch):
            docs = corpus.documents[offset:offset + batch]
            for doc, spans in zip(docs, chunker.split(docs)):
                chunks.extend(Chunk(len(chunks) + i, doc.doc_id, doc.title, doc.text[a:b], a, b)
                              for i, (a, b) in enumerate(spans))
            advance(len(docs))
        timings["chunk"] = time.perf_counter() - t

        texts = [passage_text(c) for c in chunks]
        # Validate the index parameters for this many vectors before spending minutes on embeddings.
        params = dense.build_params(settings.index, len(chunks), embedder.dimension)
        t = time.perf_counter()
        vectors = embedder.embed_many(texts, progress=steps.start("embed", len(texts)))
        timings["embed"] = time.perf_counter() - t

        t = time.perf_counter()
        advance = steps.start(f"dense index ({settings.index.kind})", 1)
        dense.save_index(dense.build_index(vectors, params), writer.folder)
        advance()
        timings["dense"] = time.perf_counter() - t

        t = time.perf_counter()
        advance = steps.start("bm25 index", 1)
        bm25, idf = sparse.build_bm25(analyzer.tokens_many(texts), r.bm25_k1, r.bm25_b)
        sparse.save_bm25(bm25, idf, writer.folder)
        write_chunks(writer.folder / CHUNKS, chunks)
        advance()
        timings["bm25"] = time.perf_counter() - t
        timings["total"] = time.perf_counter() - started

        manifest = {
            "ragheat_version": __version__,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "fingerprint": fingerprint,
            "corpus": {"name": corpus.name, "kind": corpus.kind, "location": corpus.location,
                       "content_sha256": corpus.content_sha256, "documents": len(corpus.documents),
                       "skipped_empty": corpus.skipped_empty, "skipped_duplicate": corpus.skipped_duplicate},
            "model": config["model"],
            "chunking": config["chunking"],
            "lexical": config["lexical"],
            "dense": params,
            "counts": {"documents": len(corpus.documents), "chunks": len(chunks), "vocabulary": len(idf)},
            "timings_s": {k: round(v, 3) for k, v in timings.items()},
        }
        generation = writer.publish(manifest)
    return IngestReport(Path(index_dir), generation, read_manifest(generation), skipped=False)


def _fingerprint(corpus: Corpus, config: dict) -> str:
    payload = json.dumps({"corpus": corpus.content_sha256, **config}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()

