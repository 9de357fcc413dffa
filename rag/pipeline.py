"""The query path: embed -> retrieve (dense, BM25) -> fuse -> generate, each stage timed.

Stage names form a closed set (``STAGES``) so telemetry can use them as label values.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Sequence

from rag.embedding.embedder import OnnxEmbedder
from rag.errors import IndexLoadError, StageError
from rag.generation.extractive import ExtractiveGenerator
from rag.index.store import LoadedIndex, load_index
from rag.retrieval.fusion import WeightedRRF
from rag.retrieval.lexical import LexicalAnalyzer
from rag.retrieval.retrievers import BM25Retriever, DenseRetriever
from rag.settings import RagheatSettings
from rag.threadnames import get_name, set_name, stage_comm
from rag.types import FusionResult, Hit, QueryResult, Source, StageTiming

STAGES = ("embed", "retrieve_dense", "retrieve_bm25", "fuse", "generate")
RETRIEVERS = ("dense", "bm25")


class RagPipeline:
    """Owns the loaded index and the stage implementations.

    >>> pipeline = RagPipeline(RagheatSettings(), Path("data/index")); pipeline.warm_up()
    >>> pipeline.query("what causes tides?", top_k=5).answer
    """

    def __init__(self, settings: RagheatSettings, index_dir: Path) -> None:
        self.settings = settings
        self.index_dir = Path(index_dir)
        self.index: LoadedIndex | None = None
        self.embedder: OnnxEmbedder | None = None
        self._stage_options = _StageOptions(settings.server.stage_thread_names, settings.faults.delay_stage,
                                            settings.faults.delay_ms / 1000)

    @property
    def ready(self) -> bool:
        return self.index is not None

    def warm_up(self) -> None:
        """Load the index and the model it was built with; raises ``IndexLoadError`` naming the path."""
        if self.ready:
            return
        s = self.settings
        index = load_index(self.index_dir, s.index)
        model = index.manifest["model"]
        # Queries must be embedded by exactly the model (and precision) that embedded the chunks.
        embedding = s.embedding.model_copy(update={"precision": model["precision"],
                                                   "max_seq_length": model["max_seq_length"]})
        embedder = OnnxEmbedder(embedding)
        embedder.warm_up()
        if embedder.files.weights_sha256 != model["weights_sha256"]:
            raise IndexLoadError(index.folder, f"it was built with model weights {model['weights_sha256'][:12]}…, "
                                               f"but embedding.model_dir has {embedder.files.weights_sha256[:12]}…")
        analyzer = LexicalAnalyzer(index.manifest["lexical"]["stemmer"])
        self.retrievers = {"dense": DenseRetriever(index.faiss_index), "bm25": BM25Retriever(index.bm25, analyzer)}
        self.fuser = WeightedRRF({"dense": s.retrieval.dense_weight, "bm25": s.retrieval.bm25_weight},
                                 k=s.retrieval.rrf_k)
        self.generator = ExtractiveGenerator(analyzer, index.idf, s.generation.max_sentences)
        self.embedder = embedder
        self.index = index

    def retrieve(self, query: str, k: int, retrievers: Sequence[str] | None = None,
                 stages: list[StageTiming] | None = None, counts: dict[str, int] | None = None) -> FusionResult:
        """Fused top-``k`` chunks; appends one ``StageTiming`` per stage run to ``stages`` and each
        retriever's hit count to ``counts``."""
        stages = [] if stages is None else stages
        names = list(dict.fromkeys(retrievers or self.settings.retrieval.retrievers))
        vector = None
        if "dense" in names:
            with _stage("embed", stages, self._stage_options):
                result = self.embedder.embed_query(query)
            vector = result.vector
        depth = k if len(names) == 1 else max(k, self.settings.retrieval.candidates)
        results = []
        for name in names:
            with _stage(f"retrieve_{name}", stages, self._stage_options):
                results.append(self.retrievers[name].retrieve(query, vector, depth))
            if counts is not None:
                counts[name] = len(results[-1].hits)
        if len(results) == 1:
            return FusionResult(results[0].hits[:k], 0.0)
        with _stage("fuse", stages, self._stage_options):
            return self.fuser.fuse(results, k)

    def query(self, query: str, top_k: int, retrievers: Sequence[str] | None = None) -> QueryResult:
        if not self.ready:
            raise RuntimeError("RagPipeline.warm_up() has not run")
        stages: list[StageTiming] = []
        counts: dict[str, int] = {}
        try:
            fused = self.retrieve(query, top_k, retrievers, stages, counts)
            sources = [Source(n, self.index.chunks[hit.chunk_id], hit.score) for n, hit in enumerate(fused.hits, 1)]
            passages = [s.chunk for s in sources[: self.settings.generation.passages]]
            with _stage("generate", stages, self._stage_options):
                generation = self.generator.generate(query, passages)
        except StageError as exc:
            exc.stages = stages  # what ran before (and including) the failing stage, for telemetry
            raise
        return QueryResult(generation.answer, generation.generator, sources, stages, generation.sentences, counts)

    def chunk_hits_to_docs(self, hits: Sequence[Hit]) -> list[tuple[str, float]]:
        """Collapse chunk hits to documents, keeping each document's best rank (for evaluation)."""
        seen: dict[str, float] = {}
        for hit in hits:
            seen.setdefault(self.index.chunks[hit.chunk_id].doc_id, hit.score)
        return list(seen.items())


class _StageOptions:
    def __init__(self, thread_names: bool, delay_stage: str | None, delay_s: float) -> None:
        self.thread_names, self.delay_stage, self.delay_s = thread_names, delay_stage, delay_s


class _stage:
    """Times a block as one stage and re-raises any failure as a ``StageError`` naming it.

    With ``thread_names`` the OS thread is named ``rh:<stage>`` meanwhile (see ``rag.threadnames``);
    ``delay_stage``/``delay_s`` add injected latency to one stage (``faults`` settings)."""

    def __init__(self, name: str, stages: list[StageTiming], options: _StageOptions) -> None:
        self.name, self.stages, self.options = name, stages, options

    def __enter__(self) -> None:
        if self.options.thread_names:
            self.previous_name = get_name()
            set_name(stage_comm(self.name))
        self.start = time.perf_counter()
        if self.name == self.options.delay_stage and self.options.delay_s > 0:
            time.sleep(self.options.delay_s)

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.stages.append(StageTiming(self.name, time.perf_counter() - self.start, self.start))
        if self.options.thread_names:
            set_name(self.previous_name)
        if exc is not None and not isinstance(exc, StageError):
            raise StageError(self.name, exc) from exc
        return False
