"""The query path: embed -> retrieve (dense, BM25) -> fuse -> generate, each stage timed.

Stage names form a closed set (``STAGES``) so telemetry can use them as label values. A streamed
(language-model) answer is timed as ``generate_prefill`` (request sent -> first token: the time to first
token) and ``generate_decode`` (first -> last token), then ``support_check``; when the model is down or
slow, ``generate`` runs the extractive fallback and the result says it is degraded.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Callable, Sequence

from rag.embedding.embedder import OnnxEmbedder
from rag.errors import IndexLoadError, StageError
from rag.generation.extractive import ExtractiveGenerator
from rag.generation.llm import GeneratorUnavailable
from rag.generation.support import SupportChecker
from rag.index.store import LoadedIndex, load_index
from rag.protocols import (AnswerCache, Embedder, Fuser, Generator, GraphStore, Reranker, Retriever, Router,
                           StreamingGenerator, SupportCheck)
from rag.retrieval.fusion import WeightedRRF
from rag.retrieval.lexical import LexicalAnalyzer
from rag.retrieval.retrievers import BM25Retriever, DenseRetriever
from rag.settings import GenerationSettings, RagheatSettings
from rag.stages import RETRIEVERS, STAGES  # noqa: F401  (re-exported: the pipeline's closed sets)
from rag.threadnames import original_name, set_name, stage_comm
from rag.types import (Chunk, FusionResult, GenerationResult, GenerationStats, Hit, PipelineDescription, QueryResult,
                       Source, StageTiming)


class RagPipeline:
    """Owns the loaded index and the stage implementations, each typed by its Protocol (``rag.protocols``).

    >>> pipeline = RagPipeline(RagheatSettings(), Path("data/index")); pipeline.warm_up()
    >>> pipeline.query("what causes tides?", top_k=5).answer
    >>> pipeline.close()
    """

    def __init__(self, settings: RagheatSettings, index_dir: Path) -> None:
        self.settings = settings
        self.index_dir = Path(index_dir)
        self.index: LoadedIndex | None = None
        # The stages, set by warm_up(). The query path runs, in order: router (admission) -> cache -> embedder
        # -> retrievers | graph -> fuser -> reranker -> llm (or generator) -> support; None = not in the path.
        self.embedder: Embedder | None = None
        self.retrievers: dict[str, Retriever] = {}
        self.fuser: Fuser | None = None
        self.generator: Generator | None = None  # extractive: the answer, or the fallback when the llm fails
        self.llm: StreamingGenerator | None = None  # a language model; None = extractive only
        self.support: SupportCheck | None = None
        # Declared for the stages that come next (knowledge graph, reranker, answer cache, admission); none of
        # them is built or called yet.
        self.graph: GraphStore | None = None
        self.reranker: Reranker | None = None
        self.cache: AnswerCache | None = None
        self.router: Router | None = None
        self._stage_options = _StageOptions(settings.server.stage_thread_names, settings.faults.delay_stage,
                                            settings.faults.delay_ms / 1000)

    @property
    def ready(self) -> bool:
        """True once ``warm_up()`` has loaded the index and every stage."""
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
        self.support = SupportChecker(analyzer, index.idf, s.generation.support_threshold)
        if s.generation.generator != "extractive" and self.llm is None:
            self.llm = _make_llm(s.generation)
            self.llm.warm_up()
        self.embedder = embedder
        self.index = index

    def describe(self) -> PipelineDescription:
        """What this (warmed-up) pipeline serves: index, corpus, models, and where an in-process engine's
        metrics are written."""
        if not self.ready:
            raise RuntimeError("RagPipeline.warm_up() has not run")
        manifest = self.index.manifest
        return PipelineDescription(
            index_folder=self.index.folder, generation=manifest["generation"], corpus=manifest["corpus"]["name"],
            chunks=manifest["counts"]["chunks"], embedding_model=manifest["model"]["name"],
            generator=self.settings.generation.generator,
            engine_metrics_dir=None if self.llm is None or self.llm.metrics_dir is None else Path(self.llm.metrics_dir))

    def close(self) -> None:
        """Release what ``warm_up()`` opened outside this process's memory: the model client's connections, or
        the in-process engine's processes. Idempotent."""
        if self.llm is not None:
            self.llm.close()

    def retrieve(self, query: str, k: int, retrievers: Sequence[str] | None = None,
                 stages: list[StageTiming] | None = None, counts: dict[str, int] | None = None) -> FusionResult:
        """Fused top-``k`` chunks; appends one ``StageTiming`` per stage run to ``stages`` and each
        retriever's hit count to ``counts``."""
        stages = [] if stages is None else stages
        names = list(dict.fromkeys(retrievers or self.settings.retrieval.retrievers))
        vector = None
        if "dense" in names:
            with _stage("embed", stages, self._stage_options) as stage:
                result = self.embedder.embed_query(query)
                stage.device = result.device
            vector = result.vector
        depth = k if len(names) == 1 else max(k, self.settings.retrieval.candidates)
        results = []
        for name in names:
            with _stage(f"retrieve_{name}", stages, self._stage_options) as stage:
                results.append(self.retrievers[name].retrieve(query, vector, depth))
                stage.device = results[-1].device
            if counts is not None:
                counts[name] = len(results[-1].hits)
        if len(results) == 1:
            return FusionResult(results[0].hits[:k], 0.0)
        with _stage("fuse", stages, self._stage_options):
            return self.fuser.fuse(results, k)

    def query(self, query: str, top_k: int, retrievers: Sequence[str] | None = None, *,
              on_sources: Callable[[list[Source]], None] | None = None,
              on_token: Callable[[str], None] | None = None) -> QueryResult:
        """Answer ``query``. ``on_sources`` is called once retrieval is done and ``on_token`` with each piece
        of a streamed answer as it arrives (both on this thread), for ``/v1/query/stream``."""
        if not self.ready:
            raise RuntimeError("RagPipeline.warm_up() has not run")
        stages: list[StageTiming] = []
        counts: dict[str, int] = {}
        try:
            fused = self.retrieve(query, top_k, retrievers, stages, counts)
            sources = [Source(n, self.index.chunks[hit.chunk_id], hit.score) for n, hit in enumerate(fused.hits, 1)]
            if on_sources is not None:
                on_sources(sources)
            passages = [s.chunk for s in sources[: self.settings.generation.passages]]
            generation = self._generate(query, passages, stages, on_token)
        except StageError as exc:
            exc.stages = stages  # what ran before (and including) the failing stage, for telemetry
            raise
        return QueryResult(generation.answer, generation.generator, sources, stages, generation.sentences, counts,
                           generation.stats, generation.support, generation.degraded_reason)

    def _generate(self, query: str, passages: list[Chunk], stages: list[StageTiming],
                  on_token: Callable[[str], None] | None) -> GenerationResult:
        if self.llm is not None:
            try:
                return self._generate_streamed(query, passages, stages, on_token)
            except StageError as exc:
                if not isinstance(exc.cause, GeneratorUnavailable):
                    raise
                reason = str(exc.cause)
        with _stage("generate", stages, self._stage_options):
            generation = self.generator.generate(query, passages)
        return dataclasses.replace(generation, degraded_reason=reason) if self.llm is not None else generation

    def _generate_streamed(self, query: str, passages: list[Chunk], stages: list[StageTiming],
                           on_token: Callable[[str], None] | None) -> GenerationResult:
        start = time.perf_counter()
        stream = self.llm.stream(query, passages)
        pieces = iter(stream)
        try:
            with _stage("generate_prefill", stages, self._stage_options):
                first = next(pieces, None)
                if first is None:
                    raise GeneratorUnavailable("the model returned an empty answer")
            first_at = last = time.perf_counter()
            texts, gaps = [first], []
            if on_token is not None:
                on_token(first)
            with _stage("generate_decode", stages, self._stage_options):
                for piece in pieces:
                    now = time.perf_counter()
                    gaps.append(now - last)
                    last = now
                    texts.append(piece)
                    if on_token is not None:
                        on_token(piece)
        finally:
            stream.close()
        text = "".join(texts).strip()
        with _stage("support_check", stages, self._stage_options):
            support = self.support.check(text, passages)
        stats = GenerationStats(first_at - start, tuple(gaps), stream.output_tokens or len(texts), stream.model)
        return GenerationResult(self.llm.name, [], last - start, text=text, stats=stats, support=support)

    def chunk_hits_to_docs(self, hits: Sequence[Hit]) -> list[tuple[str, float]]:
        """Collapse chunk hits to documents, keeping each document's best rank (for evaluation)."""
        seen: dict[str, float] = {}
        for hit in hits:
            seen.setdefault(self.index.chunks[hit.chunk_id].doc_id, hit.score)
        return list(seen.items())


def _make_llm(settings: GenerationSettings) -> StreamingGenerator:
    if settings.generator == "openai":
        from rag.generation.llm import OpenAIStreamGenerator

        return OpenAIStreamGenerator(settings)
    from rag.generation.vllm_engine import InProcessVllmGenerator  # needs the vllm package (.venv-vllm)

    return InProcessVllmGenerator(settings)


class _StageOptions:
    def __init__(self, thread_names: bool, delay_stage: str | None, delay_s: float) -> None:
        self.thread_names, self.delay_stage, self.delay_s = thread_names, delay_stage, delay_s


class _stage:
    """Times a block as one stage and re-raises any failure as a ``StageError`` naming it.

    With ``thread_names`` the OS thread is named ``rh:<stage>`` meanwhile (see ``rag.threadnames``);
    ``delay_stage``/``delay_s`` add injected latency to one stage (``faults`` settings). The block may set
    ``device`` to the ``rag.devicetime.DeviceTiming`` of its GPU-capable work; the timing then carries it."""

    def __init__(self, name: str, stages: list[StageTiming], options: _StageOptions) -> None:
        self.name, self.stages, self.options = name, stages, options

    def __enter__(self) -> "_stage":
        self.device = None
        if self.options.thread_names:
            self.restore_name = original_name()  # read before the first rename, cached per thread
            set_name(stage_comm(self.name))
        self.start = time.perf_counter()
        if self.name == self.options.delay_stage and self.options.delay_s > 0:
            time.sleep(self.options.delay_s)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        device = self.device
        self.stages.append(StageTiming(self.name, time.perf_counter() - self.start, self.start,
                                       None if device is None else device.device_seconds,
                                       None if device is None else device.clock))
        if self.options.thread_names:
            set_name(self.restore_name)
        if exc is not None and not isinstance(exc, StageError):
            raise StageError(self.name, exc) from exc
        return False
