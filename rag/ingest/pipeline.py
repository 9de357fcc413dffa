"""``ragheat ingest``: source -> chunks -> embeddings (+ the reranker's token vectors, from the same model run) + BM25
+ knowledge graph (+ the generation's Milvus collection, ``vector_store.backend=milvus``) -> a new index generation,
swapped in atomically."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from pydantic import SecretStr

from rag import __version__
from rag.embedding.embedder import OnnxEmbedder
from rag.index import dense, sparse
from rag.index.milvus import (VectorStoreUnavailable, dense_index_type, prune_collections, publish_generation,
                              without_credentials)
from rag.graph.ingest import build_generation_graph, graph_config, prune_store_generations
from rag.index.chunks import DIGEST_KEY, read_chunks, write_chunks
from rag.index.store import CHUNKS, GENERATIONS, MANIFEST, IndexWriter, link_files, read_manifest, resolve_generation
from rag.errors import IndexLoadError, IngestError, RagheatError
from rag.ingest.chunking import SemanticDensityChunker, TokenWindowChunker
from rag.ingest.sources import Corpus, load_source
from rag.rerank.ingest import token_config, token_writer
from rag.rerank.store import TokenVectorWriter
from rag.retrieval.lexical import LexicalAnalyzer
from rag.settings import RagheatSettings
from rag.types import Chunk

log = logging.getLogger("ragheat.ingest")


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
    """Build (or confirm up to date) the index for ``source`` in ``index_dir``. When only the knowledge graph's
    parameters changed, the new generation reuses the current one's chunks, embeddings and BM25 index (hard
    links) and rebuilds only the graph."""
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
    tokens = token_writer(settings)
    config = {
        "model": embedder.identity(),
        "chunking": chunker.params(),
        "lexical": {**analyzer.params(), "bm25": {"k1": r.bm25_k1, "b": r.bm25_b, "method": "lucene"}},
        "dense_settings": settings.index.model_dump(include={"kind", "hnsw_m", "hnsw_ef_construction",
                                                             "ivf_nlist", "pq_m", "pq_nbits"}),
    }
    if tokens is not None:  # absent when off, so an index built without them keeps its fingerprint
        config["rerank"] = token_config(tokens)
    indexes_fingerprint = _fingerprint(corpus, config)  # chunks, embeddings, FAISS, BM25
    graph_settings = graph_config(settings.graph)
    stores = {"graph": graph_settings}
    vs = settings.vector_store
    if vs.backend == "milvus":  # absent when local, so a local index keeps its fingerprint
        stores["vector_store"] = {"backend": vs.backend, "uri": vs.uri, "collection_prefix": vs.collection_prefix,
                                  "dense_index": dense_index_type(settings.index)}
    fingerprint = _fingerprint(corpus, {**config, **stores})
    reusable: Path | None = None
    if not force:
        try:
            current = read_manifest(index_dir)
            if current.get("fingerprint") == fingerprint:
                return IngestReport(Path(index_dir), None, current, skipped=True)
            if current.get("fingerprint_indexes") == indexes_fingerprint:
                reusable = resolve_generation(index_dir)
        except IndexLoadError:
            pass  # nothing usable there yet: build

    try:
        with IndexWriter.open(Path(index_dir)) as writer:
            servers = _milvus_servers(Path(index_dir))  # before publishing prunes generations, with their manifests
            if reusable is not None and reusable.is_dir():
                t = time.perf_counter()
                chunks, params, vocabulary, rerank = _reuse_indexes(reusable, writer.folder)
                timings["reused"] = time.perf_counter() - t
            else:
                chunks, params, vocabulary, rerank = _build_indexes(corpus, chunker, embedder, analyzer, settings,
                                                                    writer.folder, steps, timings, tokens)
            graph = None
            if settings.graph.enabled:
                t = time.perf_counter()
                graph = build_generation_graph(
                    writer.folder, writer.generation, chunks, settings.graph, start_step=steps.start,
                    embed_titles=lambda texts, advance: embedder.embed_many(texts, progress=advance))
                timings["graph"] = time.perf_counter() - t
            vector_store = None
            if vs.backend == "milvus":
                t = time.perf_counter()
                vector_store = _publish_to_milvus(settings, Path(index_dir), writer.generation, writer.folder, chunks,
                                                  analyzer, steps)
                timings["vector_store"] = time.perf_counter() - t
            timings["total"] = time.perf_counter() - started

            manifest = {
                "ragheat_version": __version__,
                "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "fingerprint": fingerprint,
                "fingerprint_indexes": indexes_fingerprint,
                "corpus": {"name": corpus.name, "kind": corpus.kind, "location": corpus.location,
                           "content_sha256": corpus.content_sha256, "documents": len(corpus.documents),
                           "skipped_empty": corpus.skipped_empty, "skipped_duplicate": corpus.skipped_duplicate},
                "model": config["model"],
                "chunking": config["chunking"],
                "lexical": config["lexical"],
                "dense": params,
                "rerank": rerank,
                "graph": graph,
                "vector_store": vector_store,
                "counts": {"documents": len(corpus.documents), "chunks": len(chunks), "vocabulary": vocabulary},
                "timings_s": {k: round(v, 3) for k, v in timings.items()},
            }
            generation = writer.publish(manifest)
            # Still holding the index's lock: no other ingest has a collection or graph loaded but unpublished.
            _prune_stores(settings, Path(index_dir), generation, servers)
    except OSError as exc:  # a full disk, a file-size limit, a read-only folder: a sentence, not a traceback
        where = f" ({exc.filename})" if exc.filename else ""
        raise IngestError(f"writing the new generation into {index_dir} failed: {exc.strerror or exc}{where}; the "
                          f"served generation is unchanged") from exc
    return IngestReport(Path(index_dir), generation, read_manifest(generation), skipped=False)


PENDING_SERVERS = ".milvus-servers.json"
"""In an index folder: the Milvus servers whose old collections of this index an ingest could not drop (no
generation on disk names them any more; the next ingest tries again)."""


def _milvus_servers(index_dir: Path) -> set[str]:
    """The Milvus servers (without credentials) the index's generations on disk were published to (their manifests'
    ``vector_store``), and those left with collections to drop (``PENDING_SERVERS``)."""
    servers = set()
    for path in (index_dir / GENERATIONS).glob(f"*/{MANIFEST}"):
        try:
            block = json.loads(path.read_text()).get("vector_store") or {}
        except (OSError, ValueError):  # a half-written leftover: the writer removes it
            continue
        if block.get("backend") == "milvus" and block.get("uri"):
            servers.add(without_credentials(block["uri"]))
    try:
        servers.update(json.loads((index_dir / PENDING_SERVERS).read_text()))
    except FileNotFoundError:
        pass
    except (OSError, ValueError, TypeError) as exc:
        log.warning("%s is unreadable (%s): the servers it listed are not pruned", index_dir / PENDING_SERVERS, exc)
    return servers


def _prune_stores(settings: RagheatSettings, index_dir: Path, generation: Path, servers: set[str]) -> None:
    """Remove from the graph and vector stores the generations the index folder no longer has: on the configured
    Milvus server, and on every server an older generation was published to (after a switch back to local, or to
    another server, their collections would be left behind for good). The configured server is reached with its
    credentials; another with none (its collections stay, named in a warning, when it asks for them)."""
    kept = {p.name for p in (index_dir / GENERATIONS).iterdir() if not p.name.startswith(".")}
    if settings.graph.enabled:
        prune_store_generations(settings.graph, generation, kept)
    vs = settings.vector_store
    configured = without_credentials(vs.uri) if vs.backend == "milvus" else None
    pending = []
    for server in sorted(servers | {configured} - {None}):
        reach = (vs if server == configured
                 else vs.model_copy(update={"backend": "milvus", "uri": server, "token": SecretStr("")}))
        try:
            prune_collections(reach, index_dir, kept)
        except VectorStoreUnavailable as exc:  # published and served already: the next ingest prunes what is left
            log.warning("the old generations' Milvus collections were not dropped: %s", exc)
            pending.append(server)
    path = index_dir / PENDING_SERVERS
    if pending:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(pending))
        os.replace(tmp, path)
    else:
        path.unlink(missing_ok=True)


def _publish_to_milvus(settings: RagheatSettings, index_dir: Path, generation: str, folder: Path,
                       chunks: Sequence[Chunk], analyzer: LexicalAnalyzer, steps: _Steps) -> dict:
    """The new generation's passages (its dense index's vectors, the BM25 terms of its chunks) into its collection
    on the Milvus server; the manifest's ``vector_store`` block."""
    vectors = dense.stored_vectors(folder)
    terms = [" ".join(tokens) for tokens in analyzer.tokens_many(passage_text(c) for c in chunks)]
    try:
        return publish_generation(settings.vector_store, settings.index, settings.retrieval, index_dir, generation,
                                  vectors, terms, advance=steps.start("vector store: load (milvus)", len(chunks)))
    except (VectorStoreUnavailable, RagheatError, ValueError) as exc:
        raise IngestError(f"publishing the passages to Milvus failed: {exc}; the served generation is "
                          f"unchanged") from exc


def _build_indexes(corpus: Corpus, chunker, embedder: OnnxEmbedder, analyzer: LexicalAnalyzer,
                   settings: RagheatSettings, folder: Path, steps: _Steps, timings: dict[str, float],
                   tokens: TokenVectorWriter | None) -> tuple[list[Chunk], dict, int, dict | None]:
    """Chunk, embed, and write the dense and BM25 indexes (and the reranker's token vectors) into ``folder``:
    (chunks, dense params, vocabulary, the manifest's rerank block)."""
    t = time.perf_counter()
    advance = steps.start(f"chunk ({chunker.name})", len(corpus.documents))
    chunks: list[Chunk] = []
    batch = 512
    for offset in range(0, len(corpus.documents), batch):
        docs = corpus.documents[offset:offset + batch]
        for doc, spans in zip(docs, chunker.split(docs)):
            first = len(chunks)  # a chunk's id is its line in chunks.jsonl (read before extend() grows the list)
            chunks.extend(Chunk(first + i, doc.doc_id, doc.title, doc.text[a:b], a, b)
                          for i, (a, b) in enumerate(spans))
        advance(len(docs))
    timings["chunk"] = time.perf_counter() - t

    texts = [passage_text(c) for c in chunks]
    # Validate the index parameters for this many vectors before spending minutes on embeddings.
    params = dense.build_params(settings.index, len(chunks), embedder.dimension)
    t = time.perf_counter()
    if tokens is not None:
        tokens.spill_into(folder)  # the token vectors go to disk as they come, not into memory
    try:
        vectors = embedder.embed_many(texts, progress=steps.start("embed", len(texts)),
                                      on_tokens=None if tokens is None else tokens.add)
        timings["embed"] = time.perf_counter() - t
        rerank = None
        if tokens is not None:
            t = time.perf_counter()
            advance = steps.start(f"rerank token vectors ({tokens.dtype})", 1)  # product codes learn a codebook here
            rerank = tokens.write(folder, len(chunks))
            advance()
            timings["rerank_tokens"] = time.perf_counter() - t
    finally:
        if tokens is not None:
            tokens.discard()  # nothing left to discard once written; the spill files after a failure

    t = time.perf_counter()
    advance = steps.start(f"dense index ({settings.index.kind})", 1)
    dense.save_index(dense.build_index(vectors, params), folder)
    advance()
    timings["dense"] = time.perf_counter() - t

    t = time.perf_counter()
    advance = steps.start("bm25 index", 1)
    r = settings.retrieval
    bm25, idf = sparse.build_bm25(analyzer.tokens_many(texts), r.bm25_k1, r.bm25_b)
    sparse.save_bm25(bm25, idf, folder)
    write_chunks(folder / CHUNKS, chunks)
    advance()
    timings["bm25"] = time.perf_counter() - t
    return chunks, params, len(idf), rerank


def _reuse_indexes(current: Path, folder: Path) -> tuple[Sequence[Chunk], dict, int, dict | None]:
    """Hard-link (or copy) the current generation's files, except its manifest and graph, into ``folder``."""
    manifest = json.loads((current / MANIFEST).read_text())
    link_files(current, folder, skip={MANIFEST, *((manifest.get("graph") or {}).get("files", ()))})
    chunks = list(read_chunks(folder / CHUNKS, manifest.get(DIGEST_KEY)))  # walked several times: parsed once
    return chunks, manifest["dense"], manifest["counts"]["vocabulary"], manifest.get("rerank")


def _fingerprint(corpus: Corpus, config: dict) -> str:
    payload = json.dumps({"corpus": corpus.content_sha256, **config}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()

