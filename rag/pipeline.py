"""The query path, in the order of the stage table (``rag.stages.STAGE_TABLE``): queue -> embed (on first use) ->
[cache_lookup] -> [link_entities -> route] -> [hyde] -> retrieve_dense, retrieve_bm25, [retrieve_graph] -> fuse ->
[rerank] -> generate_prefill -> generate_decode -> support_check, or generate (extractive). Each stage is timed
(``rag.query_context.StageTimer``) into the request's ``QueryContext``, which carries everything the request is and
has done.

``rerank`` (``rerank.enabled``, or per call) rescores the top fused candidates by late interaction (rag/rerank) with
the query's token states from the embed stage's own model run. ``link_entities`` and ``route`` run for requests that
use the knowledge graph or the router: a ``routed`` request lets the router pick its retrievers, their fusion
weights and whether the reranker runs for it (within what the request and its quality level allow); the graph runs
only for a query that linked an entity, and when its store is down the stage is skipped and the answer says it is
degraded. A streamed (language-model) answer is timed as ``generate_prefill`` (request sent ->
first token), ``generate_decode`` (first -> last token), then ``support_check``; when the model is down or slow, or
none of its sentences is supported by the passages, ``generate`` runs the extractive fallback and the result says
it is degraded, and why (``rag.stages.DEGRADED_REASONS``).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from rag.deadline import Deadline
from rag.embedding.batcher import MicroBatchEmbedder
from rag.embedding.embedder import OnnxEmbedder
from rag.embedding.model_store import check_index_model
from rag.errors import ConfigurationError, IndexLoadError, StageError
from rag.eval.judge import CompleterAsker
from rag.generation.extractive import ExtractiveGenerator
from rag.generation.hyde import HydeSkipped, HydeWriter
from rag.generation.llm import GeneratorUnavailable
from rag.generation.prompt_budget import PassageCompressor
from rag.generation.support import SupportChecker
from rag.graph.store import GraphStoreUnavailable
from rag.index.milvus import MilvusStore, VectorStoreUnavailable, open_generation
from rag.index.store import LoadedIndex, load_index
from rag.protocols import (AnswerCache, Embedder, EntityLinker, Fuser, Generator, GraphRetriever, GraphStore,
                           HypotheticalPassageWriter, PromptCompressor, Reranker, Retriever, Router,
                           StreamingGenerator, SupportCheck)
from rag.quality.calibration import CalibrationError
from rag.quality.judge import SampledJudge
from rag.quality.signals import QualityMeter
from rag.query_context import QueryContext, StageOptions
from rag.rerank.features import RerankQuery
from rag.retrieval.fusion import WeightedRRF
from rag.retrieval.lexical import LexicalAnalyzer
from rag.retrieval.retrievers import BM25Retriever, DenseRetriever, milvus_retrievers
from rag.routing.names import ROUTED, expand, route_label
from rag.settings import GenerationSettings, RagheatSettings
from rag.stages import LEVEL_BY_NAME, QUALITY_LEVELS, TOP_LEVEL
from rag.types import (UNSUPPORTED_MARK, CacheKey, CacheStats, Chunk, GenerationResult, GenerationStats, Hit,
                       PipelineDescription, QueryResult, RetrievalResult, Source)


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
        # The stages, set by warm_up(), in the stage table's order (rag/stages.py); None = not in the path.
        self.embedder: Embedder | None = None  # embed
        # cache.enabled: the semantic answer cache (cache_lookup). One per pipeline, so one per index generation: a
        # hot swap builds a new pipeline, whose cache starts empty.
        self.cache: AnswerCache | None = None
        # The knowledge graph (an index built with one, graph.enabled) and the router (routed requests).
        self.linker: EntityLinker | None = None  # link_entities
        self.router: Router | None = None  # route
        self.hyde: HypotheticalPassageWriter | None = None  # hyde: whenever there is a language model
        self.retrievers: dict[str, Retriever] = {}  # retrieve_dense, retrieve_bm25
        self.vector_store: MilvusStore | None = None  # vector_store.backend=milvus: what those two search
        self._collection: str | None = None  # ... in this generation's collection
        self.graph_retriever: GraphRetriever | None = None  # retrieve_graph, over self.graph
        self.graph: GraphStore | None = None
        self.fuser: Fuser | None = None  # fuse
        self.reranker: Reranker | None = None  # rerank.enabled: late interaction (rag/rerank)
        self.llm: StreamingGenerator | None = None  # generate_prefill, generate_decode; None = extractive only
        self.compressor: PromptCompressor | None = None  # generation.prompt_budget_tokens (0 = passages whole)
        self.support: SupportCheck | None = None  # support_check
        self.generator: Generator | None = None  # generate: the extractive answer, and the model's fallback
        self.quality: QualityMeter | None = None  # quality.enabled: each answer's label-free signals (rag/quality)
        self.judge: SampledJudge | None = None  # quality.judge_rate: the model judges a share of answers, off the path
        self._route_fusers: dict[str, Fuser] = {}
        self._router_error: str | None = None
        self._stage_options = StageOptions(settings.server.stage_thread_names, settings.faults.delay_stage,
                                           settings.faults.delay_ms / 1000)

    @property
    def ready(self) -> bool:
        """True once ``warm_up()`` has loaded the index and every stage."""
        return self.index is not None

    def warm_up(self) -> None:
        """Load the index and the model it was built with; raises ``IndexLoadError`` naming the path. When a step
        fails after the language model (an in-process engine: child processes) or the graph store (a child process)
        started, those are closed before the error is raised, so nothing leaks and a retry starts afresh."""
        if self.ready:
            return
        before = (self.llm, self.graph)
        try:
            self._warm_up()
        except BaseException as exc:
            self._release_failed_warm_up(before, exc)
            raise

    def _release_failed_warm_up(self, before: tuple, exc: BaseException) -> None:
        """Close and forget what the failed ``warm_up()`` started; a failure to close is noted on ``exc``."""
        llm_before, graph_before = before
        if self.judge is not None:  # its thread, started after the model
            self.judge.close()
            self.judge = None
        started = []
        if self.llm is not llm_before:
            started.append(self.llm)
            self.llm = llm_before
        if self.graph is not graph_before:
            started.append(self.graph)
            self.graph, self.linker, self.graph_retriever = graph_before, None, None
        if self.vector_store is not None:
            started.append(self.vector_store)
            self.vector_store, self.retrievers = None, {}
        for part in started:
            try:
                part.close()
            except Exception as close_exc:  # noqa: BLE001 - the warm-up's own error is the one to raise
                exc.add_note(f"closing {type(part).__name__} after the failed warm-up also failed: {close_exc!r}")

    def _warm_up(self) -> None:
        s = self.settings
        # With a Milvus server searching and no fallback, the dense and BM25 indexes stay on disk.
        store_only = s.vector_store.backend == "milvus" and s.vector_store.fallback == "none"
        index = load_index(self.index_dir, s.index, searchable=not store_only)
        model = index.manifest["model"]
        # Queries must be embedded by exactly the model (and precision) that embedded the chunks.
        embedding = s.embedding.model_copy(update={"precision": model["precision"],
                                                   "max_seq_length": model["max_seq_length"]})
        embedder = OnnxEmbedder(embedding)
        embedder.warm_up()
        check_index_model(index.folder, model, embedder.files)  # same weights and int8 scheme, or IndexLoadError
        if embedding.query_batch_max > 1:  # concurrent requests' queries share model runs (rag/embedding/batcher.py)
            embedder = MicroBatchEmbedder(embedder, embedding.query_batch_max, embedding.query_batch_wait_ms / 1000,
                                          embedding.query_batch_runs)
        analyzer = LexicalAnalyzer(index.manifest["lexical"]["stemmer"])
        self.retrievers = {} if store_only else {"dense": DenseRetriever(index.faiss_index),
                                                 "bm25": BM25Retriever(index.bm25, analyzer)}
        # The generation's collection on the server, checked like its files; a server that cannot be reached leaves
        # the store down (its files answer, or with no fallback the two stages are skipped) until a search reaches it.
        if s.vector_store.backend == "milvus":
            store, collection, exact = open_generation(s.vector_store, index.folder, index.manifest)
            self.vector_store, self._collection = store, collection
            self.retrievers = milvus_retrievers(store, collection, None if exact else s.index.hnsw_ef_search,
                                                analyzer, fallbacks=self.retrievers)
        self.fuser = WeightedRRF({"dense": s.retrieval.dense_weight, "bm25": s.retrieval.bm25_weight,
                                  "graph": s.graph.weight}, k=s.retrieval.rrf_k)
        self.generator = ExtractiveGenerator(analyzer, index.idf, s.generation.max_sentences)
        self.support = SupportChecker(analyzer, index.idf, s.generation.support_threshold)
        if s.quality.enabled:
            try:
                self.quality = QualityMeter.from_settings(s.quality)
            except CalibrationError as exc:
                raise ConfigurationError(str(exc)) from None
        budget = s.generation.prompt_budget_tokens
        self.compressor = compressor = PassageCompressor(analyzer, index.idf, budget) if budget else None
        if s.generation.generator != "extractive" and self.llm is None:
            self.llm = _make_llm(s.generation)
            self.llm.warm_up()
        if self.llm is not None:
            self.hyde = HydeWriter(self.llm, s.hyde)
        elif s.hyde.enabled:
            raise ConfigurationError("hyde.enabled needs a language model: set generation.generator to openai or vllm")
        if s.quality.judge_rate > 0:
            if self.llm is None:
                raise ConfigurationError("quality.judge_rate needs a language model: set generation.generator to "
                                         "openai or vllm")
            shorten = (lambda query, passage: compressor.compress(query, [passage])[0]) if compressor else None
            self.judge = SampledJudge(CompleterAsker(self.llm, s.generation.deadline_s), s.quality.judge_rate,
                                      s.quality.judge_queue, prepare=shorten)
        self._warm_up_graph(index, analyzer)
        if s.rerank.enabled:  # the generation's stored token vectors and the head that projected them
            from rag.rerank.reranker import load_reranker

            self.reranker = load_reranker(index.folder, index.manifest, s.rerank.head, s.rerank.candidates)
            self.reranker.warm_up(s.placement.memory)  # before the generation is served: pages and sessions ready
        if s.cache.enabled:
            from rag.cache import SemanticCache

            self.cache = SemanticCache(s.cache)
        self.embedder = embedder
        self.index = index
        if s.placement.memory == "lock":  # everything this generation mapped, faulted in and kept (rag/placement.py)
            from rag.placement import lock_mapped_memory

            lock_mapped_memory()

    def _warm_up_graph(self, index: LoadedIndex, analyzer: LexicalAnalyzer) -> None:
        """Start the graph store and linker when the index has a graph (and graph.enabled), and load the router."""
        from rag.routing.arms import arm_weights
        from rag.routing.router import LogisticRouter

        s = self.settings
        if s.graph.enabled and index.manifest.get("graph"):
            from rag.graph.serving import load_graph_stage

            stage = load_graph_stage(s.graph, index.folder, index.manifest)
            self.graph, self.linker, self.graph_retriever = stage.store, stage.linker, stage.retriever
        elif "graph" in s.retrieval.retrievers:
            raise IndexLoadError(index.folder, "retrieval.retrievers names graph, but this index has no knowledge "
                                               "graph (or graph.enabled is off); rebuild it with graph.enabled")
        weights = arm_weights(s)
        self._route_fusers = {arm: WeightedRRF(w, k=s.retrieval.rrf_k) for arm, w in weights.items()}
        available = set(self.retrievers) | ({"graph"} if self.graph_retriever else set())
        try:
            self.router = LogisticRouter.load(s.retrieval.router_model, weights, index.idf, analyzer, available,
                                              can_rerank=s.rerank.enabled)
        except IndexLoadError as exc:
            if ROUTED in s.retrieval.retrievers:
                raise
            # Only routed requests need it: they are refused with this sentence (and train-router, whose pipelines
            # serve hybrid, can run to replace it).
            self._router_error = f"routed needs the router model, which cannot be loaded: {exc}"

    def check_retrievers(self, retrievers: Sequence[str]) -> str | None:
        """Why this pipeline cannot serve ``retrievers`` (a sentence), or None when it can."""
        try:
            names = expand(retrievers)
        except ValueError as exc:
            return str(exc)
        if "graph" in names and self.graph_retriever is None:
            return "this index has no knowledge graph (it was built with graph.enabled off), so graph cannot run"
        if names == (ROUTED,) and self.router is None:
            return self._router_error or "routed needs the router model"
        return None

    def describe(self) -> PipelineDescription:
        """What this (warmed-up) pipeline serves: index, corpus, models, and where an in-process engine's
        metrics are written."""
        if not self.ready:
            raise RuntimeError("RagPipeline.warm_up() has not run")
        manifest = self.index.manifest
        return PipelineDescription(
            index_folder=self.index.folder, generation=manifest["generation"], corpus=manifest["corpus"]["name"],
            chunks=manifest["counts"]["chunks"], embedding_model=manifest["model"]["name"],
            passage_precision=manifest["model"]["precision"], query_precision=self.embedder.query_precision,
            lone_query_threads=self.embedder.lone_query_threads,
            vector_store=None if self.vector_store is None else {
                "backend": "milvus", "collection": self._collection, "fallback": self.settings.vector_store.fallback,
                "down": self.vector_store.down, "down_because": self.vector_store.down_because,
                "failed_searches": self.vector_store.failures},
            generator=self.settings.generation.generator,
            engine_metrics_dir=None if self.llm is None or self.llm.metrics_dir is None else Path(self.llm.metrics_dir),
            graph_backend=None if self.graph is None else self.graph.name,
            graph_ready=None if self.graph_retriever is None else self.graph_retriever.ready())

    def close(self) -> None:
        """Release what ``warm_up()`` opened outside this process's memory: the model client's connections, or
        the in-process engine's processes, the graph store (the embedded one's child process) and the Milvus client.
        Idempotent."""
        if self.judge is not None:
            self.judge.close()
        if self.llm is not None:
            self.llm.close()
        if self.graph is not None:
            self.graph.close()
        if self.vector_store is not None:
            self.vector_store.close()

    # -- the query path, in the order of the stage table (rag/stages.py) ------------------------------------------

    def query(self, query: str, top_k: int, retrievers: Sequence[str] | None = None, *,
              on_sources: Callable[[list[Source]], None] | None = None,
              on_token: Callable[[str], None] | None = None, arrival: float | None = None,
              deadline: Deadline | None = None, level: str = TOP_LEVEL) -> QueryResult:
        """Answer ``query``. ``on_sources`` is called once retrieval is done and ``on_token`` with each piece
        of a streamed answer as it arrives (both on this thread), for ``/v1/query/stream``. ``arrival``: when the
        request arrived (``time.perf_counter()``): the wait until now is its ``queue`` stage. ``deadline``
        (``rag.deadline``): optional stages it cannot hold are skipped and listed in ``skipped``. With the answer
        cache (``cache.enabled``) the query is embedded and looked up first (stage ``cache_lookup``): a hit is the
        stored answer with this request's stages; a miss retrieves with that embedding and stores a non-degraded
        answer. ``level``: the quality ladder's rung to serve it at (``rag.stages.QUALITY_LEVELS``; ``rag.steering``
        picks it under load); a level that never embeds skips the cache."""
        context = self._context(query, top_k, retrievers, deadline=deadline, arrival=arrival, level=level)
        try:
            hit = self._look_up(context) if self.cache is not None and context.level.dense else None
            if hit is not None:
                if on_sources is not None:
                    on_sources(hit.sources)
                return dataclasses.replace(hit, stages=context.stages, cache="hit")
            self._retrieve(context)
            sources = [Source(n, self.index.chunks[h.chunk_id], h.score) for n, h in enumerate(context.hits, 1)]
            if on_sources is not None:
                on_sources(sources)
            passages = [s.chunk for s in sources[: self.settings.generation.passages]]
            generation = self._answer(context, passages, on_token)
        except StageError as exc:
            exc.stages = context.stages  # what ran before (and including) the failing stage, for telemetry
            raise
        result = context.result(generation, sources)
        if self.quality is not None:
            result.quality = self.quality.measure(context, generation)
        if self.judge is not None and sources:
            self.judge.offer(query, sources[0].chunk)
        if context.cache_key is not None and not result.degraded:
            # Stored without what only this request did (its timings, retrievers' counts, the model's timing), so a
            # hit is never counted as retrieval or generation by whoever observes it.
            self.cache.put(context.cache_key, dataclasses.replace(result, stages=[], retrieved={}, generation=None))
        return result

    def retrieve(self, query: str, k: int, retrievers: Sequence[str] | None = None, *, rerank: bool | None = None,
                 hyde: bool | None = None, deadline: Deadline | None = None, level: str = TOP_LEVEL,
                 reranker: Reranker | None = None) -> QueryContext:
        """Retrieval alone, as ``query()`` runs it (for evaluation, training and benchmarks): the request's context,
        whose ``hits`` are the fused top ``k`` and whose ``stages``, ``route``, ``retrieved`` and ``skipped`` say
        what ran. ``retrievers``: names as ``rag.routing.names.expand`` reads them (``dense``, ``hybrid+graph``,
        ``routed``, ...). ``rerank``: rescore the top ``rerank.candidates`` (None = when the reranker is loaded,
        i.e. ``rerank.enabled``). ``hyde``: a hypothetical passage's dense run fused into the dense one (None =
        ``hyde.enabled``; only when dense runs). ``level``: the quality ladder's rung (cuts what ``rerank``, ``hyde``
        and ``retrievers`` ask for). ``reranker``: another head's reranker in place of the pipeline's (evaluation)."""
        context = self._context(query, k, retrievers, rerank=rerank, hyde=hyde, deadline=deadline, level=level,
                                reranker=reranker)
        self._retrieve(context)
        return context

    def _context(self, query: str, top_k: int, retrievers: Sequence[str] | None, *, rerank: bool | None = None,
                 hyde: bool | None = None, deadline: Deadline | None = None,
                 arrival: float | None = None, level: str = TOP_LEVEL,
                 reranker: Reranker | None = None) -> QueryContext:
        if not self.ready:
            raise RuntimeError("RagPipeline.warm_up() has not run")
        reranker = reranker or self.reranker
        rerank = reranker is not None if rerank is None else rerank
        if rerank and reranker is None:
            raise ValueError("rerank needs rerank.enabled (and an index with stored token vectors)")
        hyde = self.settings.hyde.enabled if hyde is None else hyde
        if hyde and self.hyde is None:
            raise ValueError("hyde needs a language model: set generation.generator to openai or vllm")
        if level not in LEVEL_BY_NAME:
            raise ValueError(f"level: {level!r} is not one of {', '.join(QUALITY_LEVELS)}")
        rung = LEVEL_BY_NAME[level]
        depth = min(reranker.candidates, rung.rerank_candidates or reranker.candidates) if rerank else 0
        names = expand(retrievers or self.settings.retrieval.retrievers)
        context = QueryContext(query, top_k, names, rerank and rung.rerank_candidates != 0, hyde and rung.hyde,
                               deadline, self._stage_options, level=rung, rerank_depth=depth, reranker=reranker)
        if names != (ROUTED,):
            context.names = context.cut_by_level(names)
        elif not rung.dense:  # the level leaves BM25 alone: nothing for the router to choose, nothing to link
            context.names = ("bm25",)
        if arrival is not None:
            context.add_wait(arrival, time.perf_counter() - arrival)
        return context

    def _embedding(self, context: QueryContext) -> np.ndarray:
        """The query's vector, embedding it on first use (stage ``embed``): one model run gives the pooled vector
        and, when reranking, the token states."""
        if context.vector is not None:
            return context.vector
        with context.stage("embed") as stage:
            if context.rerank:
                result, context.token_states = self.embedder.embed_query_tokens(context.query)
            else:
                result = self.embedder.embed_query(context.query)
            stage.device, stage.waited = result.device, result.queued
        if result.queued:  # the wait for a shared model run is queueing, not embedding
            context.add_wait(stage.start, result.queued)
        context.vector = result.vector
        return context.vector

    def _look_up(self, context: QueryContext) -> QueryResult | None:
        """Stage ``cache_lookup``: the stored answer to a question this close, in the same scope, or None."""
        vector = self._embedding(context)
        with context.stage("cache_lookup"):
            context.cache_key = CacheKey(vector, context.top_k, context.names, context.rerank,
                                         self.index.manifest["generation"])
            return self.cache.get(context.cache_key)

    def _retrieve(self, context: QueryContext) -> None:
        self._plan(context)
        self._run_retrievers(context)
        self._fuse_and_rerank(context)

    def _plan(self, context: QueryContext) -> None:
        """Stages ``link_entities`` and ``route``: which retrievers run, with which fusion weights, and (routed)
        whether the reranker runs. A routed request is embedded first (every route searches dense); its entities are
        linked even at a level without the graph, as the router's features read them."""
        names = context.names
        routed = names == (ROUTED,)
        if routed:  # every route searches dense: embedded first, in the stage table's order
            self._embedding(context)
        if self.linker is not None and (routed or "graph" in names):
            vector = self._embedding(context) if self.linker.needs_vector else context.vector
            with context.stage("link_entities"):
                context.linked = self.linker.link(context.query, vector)
        context.fuser = self.fuser
        if routed:
            if self.router is None:
                raise ValueError(self.check_retrievers(names))
            with context.stage("route"):
                route = self.router.route(context.query, context.linked, rerank=context.rerank)
            context.names, context.route, context.fuser = route.retrievers, route.name, self._route_fusers[route.name]
            if not route.rerank:  # the router keeps the fused order for this query: not a skip, not degraded
                context.rerank, context.rerank_depth = False, 0
            if (cut := context.cut_by_level(route.retrievers)) != route.retrievers:  # the arm, less what the level cuts
                context.names, context.route = cut, route_label(cut)
            return
        if "graph" in names and self.graph_retriever is None:
            raise ValueError(self.check_retrievers(names))
        if not context.linked.seeds:
            context.names = tuple(n for n in names if n != "graph")  # nothing to expand: no stage, no round trip
        context.route = route_label(context.names)

    def _candidates(self, context: QueryContext) -> int:
        """How many fused hits go on: the reranker's candidates when reranking, else the answer's top k."""
        return max(context.top_k, context.rerank_depth) if context.rerank else context.top_k

    def _run_retrievers(self, context: QueryContext) -> None:
        """Stages ``hyde`` and ``retrieve_<name>``: each retriever's list, in ``context.results``."""
        names = context.names
        if "dense" in names or context.rerank:
            self._embedding(context)
        hyde_vector = (self._hyde(context) if context.hyde and "dense" in names and context.fits("hyde")
                       else None)
        fused_k = self._candidates(context)
        effort = context.level.search_effort
        depth = fused_k if len(names) == 1 else max(fused_k, round(self.settings.retrieval.candidates * effort))
        for name in names:
            if name == "graph" and not context.fits("retrieve_graph"):
                continue  # the deadline cannot hold it: answered without the graph, flagged degraded
            with context.stage(f"retrieve_{name}") as stage:
                if name == "graph":
                    try:
                        result = self.graph_retriever.retrieve(context.linked, depth)
                    except GraphStoreUnavailable as exc:  # answered without the graph, flagged degraded
                        context.skipped["retrieve_graph"] = str(exc)
                        continue
                else:
                    try:
                        result = self.retrievers[name].retrieve(context.query, context.vector, depth, effort=effort)
                    except VectorStoreUnavailable as exc:  # no fallback: answered without it, flagged degraded
                        context.skipped[f"retrieve_{name}"] = str(exc)
                        continue
                    if name == "dense" and result.hits:
                        context.best_similarity = result.hits[0].score
                    if name == "dense" and hyde_vector is not None:
                        try:
                            result = self._fuse_hyde(result, context.query, hyde_vector, depth)
                        except VectorStoreUnavailable as exc:  # the question's own list stands
                            context.skipped["hyde"] = str(exc)
                stage.device = result.device
            context.results.append(result)
            context.retrieved[name] = len(result.hits)

    def _hyde(self, context: QueryContext) -> np.ndarray | None:
        """The hypothetical passage's embedding (stage ``hyde``: writing and embedding it), or None when the stage
        was skipped (model down, slow or unusable: ``context.skipped["hyde"]`` says so)."""
        with context.stage("hyde") as stage:
            try:
                passage = self.hyde.write(context.query)
            except HydeSkipped as exc:
                context.skipped["hyde"] = str(exc)
                return None
            result = self.embedder.embed_query(passage)
            stage.device = result.device
        return result.vector

    def _fuse_hyde(self, question: RetrievalResult, query: str, hyde_vector, depth: int) -> RetrievalResult:
        """The question's dense run and the hypothetical passage's, fused by RRF (``hyde.weight``) into one dense
        run, so fusion with the other retrievers and the route label see ``dense`` as before."""
        passage = self.retrievers["dense"].retrieve(query, hyde_vector, depth)
        fuser = WeightedRRF({"dense": 1.0, "hyde": self.settings.hyde.weight}, k=self.settings.retrieval.rrf_k)
        fused = fuser.fuse([question, dataclasses.replace(passage, retriever="hyde")], depth)
        return RetrievalResult("dense", fused.hits, question.seconds + passage.seconds, question.device)

    def _fuse_and_rerank(self, context: QueryContext) -> None:
        """Stages ``fuse`` (when more than one list) and ``rerank``: ``context.hits``, the answer's top k."""
        results, fused_k = context.results, self._candidates(context)
        if len(results) <= 1:
            fused = results[0].hits[:fused_k] if results else []
        else:
            with context.stage("fuse"):
                fused = context.fuser.fuse(results, fused_k).hits
            context.fused_top_score = fused[0].score if fused else None
        if not (context.rerank and context.fits("rerank")):
            context.hits = fused[:context.top_k]
            return
        with context.stage("rerank"):
            first_stage = RerankQuery(context.token_states, {r.retriever: r.hits for r in results})
            depth = context.rerank_depth  # the level's depth; the candidates past it keep their fused order
            reranked = context.reranker.rerank(first_stage, fused[:depth], context.top_k).hits
            context.hits = context.reranked = reranked + fused[depth:][:context.top_k - len(reranked)]

    def _answer(self, context: QueryContext, passages: list[Chunk],
                on_token: Callable[[str], None] | None) -> GenerationResult:
        """The model's answer with its unsupported sentences dropped or marked; the extractive answer (stage
        ``generate``), flagged degraded, when the model is down or slow, or none of its sentences is supported by the
        passages, or the request's deadline cannot hold it (then also listed in ``context.skipped``)."""
        written = None
        llm = self.llm if context.level.language_model else None  # a level without it: the extractive answer
        if llm is not None and not context.fits("generate_prefill"):
            reason, detail = "slow", context.skipped["generate_prefill"]
        elif llm is not None:
            try:
                written = self._write(context, passages, on_token)
            except StageError as exc:
                if not isinstance(exc.cause, GeneratorUnavailable):
                    raise
                reason, detail = exc.cause.reason, str(exc.cause)
            else:
                if any(s.supported for s in written.support):
                    return _apply_unsupported_policy(written, self.settings.generation.unsupported)
                # Noise, or text the passages do not carry: never served as the answer.
                reason = "unsupported"
                detail = (f"none of the {len(written.support)} written sentences is supported by the passages "
                          f"it cites" if written.support else "the written answer has no sentence to check")
        with context.stage("generate"):
            generation = self.generator.generate(context.query, passages)
        if llm is None:
            return generation
        # The model's timing and its checked sentences stay: it did answer, and both are measured and counted.
        return dataclasses.replace(generation, degraded_reason=reason, degraded_detail=detail,
                                   stats=written.stats if written else None,
                                   support=written.support if written else (),
                                   unsupported_policy=written.unsupported_policy if written else None)

    def _write(self, context: QueryContext, passages: list[Chunk],
               on_token: Callable[[str], None] | None) -> GenerationResult:
        """Stages ``generate_prefill``, ``generate_decode`` and ``support_check``: the language model's answer."""
        start = time.perf_counter()
        # The prompt gets the passages cut to the prompt budget; the support check reads them whole.
        prompt_passages = self.compressor.compress(context.query, passages) if self.compressor else passages
        stream = self.llm.stream(context.query, prompt_passages)
        pieces = iter(stream)
        try:
            with context.stage("generate_prefill"):
                first = next(pieces, None)
                if first is None:
                    raise GeneratorUnavailable("the model returned an empty answer")
            first_at = last = time.perf_counter()
            texts, gaps = [first], []
            if on_token is not None:
                on_token(first)
            with context.stage("generate_decode"):
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
        with context.stage("support_check"):
            support = self.support.check(text, passages)
        stats = GenerationStats(first_at - start, tuple(gaps), stream.output_tokens or len(texts), stream.model)
        return GenerationResult(self.llm.name, [], last - start, text=text, stats=stats, support=support,
                                unsupported_policy=self.settings.generation.unsupported)

    # -- for telemetry and evaluation -------------------------------------------------------------------------------

    def cache_stats(self) -> CacheStats | None:
        """The answer cache's entries, bytes and counts (for telemetry's gauges); None without a cache."""
        return None if self.cache is None else self.cache.stats()

    def chunk_hits_to_docs(self, hits: Sequence[Hit]) -> list[tuple[str, float]]:
        """Collapse chunk hits to documents, keeping each document's best rank (for evaluation)."""
        seen: dict[str, float] = {}
        for hit in hits:
            seen.setdefault(self.index.chunks[hit.chunk_id].doc_id, hit.score)
        return list(seen.items())


def _apply_unsupported_policy(written: GenerationResult, policy: str) -> GenerationResult:
    """A partly supported written answer with its unsupported sentences left out (``drop``) or followed by
    ``UNSUPPORTED_MARK`` (``mark``); a fully supported one verbatim."""
    if all(s.supported for s in written.support):
        return written
    if policy == "drop":
        text = " ".join(s.text for s in written.support if s.supported)
    else:
        text = " ".join(s.text if s.supported else f"{s.text} {UNSUPPORTED_MARK}" for s in written.support)
    return dataclasses.replace(written, text=text)


def _make_llm(settings: GenerationSettings) -> StreamingGenerator:
    if settings.generator == "openai":
        from rag.generation.llm import OpenAIStreamGenerator

        return OpenAIStreamGenerator(settings)
    from rag.generation.vllm_engine import InProcessVllmGenerator  # needs the vllm package (.venv-vllm)

    return InProcessVllmGenerator(settings)
