"""The query path: [link_entities -> route] -> embed -> retrieve (dense, BM25, graph) -> fuse -> [rerank] -> generate,
each stage timed. ``rerank`` (``rerank.enabled``, or per call) rescores the top fused candidates by late interaction
(rag/rerank) with the query's token states from the embed stage's own model run. ``link_entities`` and ``route`` run for requests that use the knowledge graph or the router: a
``routed`` request lets the router pick its retrievers and their fusion weights; the graph runs only for a query that
linked an entity, and when its store is down the stage is skipped and the answer says it is degraded.

Stage names form a closed set (``STAGES``) so telemetry can use them as label values. A streamed
(language-model) answer is timed as ``generate_prefill`` (request sent -> first token: the time to first
token) and ``generate_decode`` (first -> last token), then ``support_check``; when the model is down or
slow, or none of its sentences is supported by the passages, ``generate`` runs the extractive fallback and the
result says it is degraded, and why (``rag.types.DEGRADED_REASONS``).
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
from rag.generation.extractive import ExtractiveGenerator
from rag.generation.prompt_budget import PassageCompressor
from rag.generation.hyde import HydeSkipped, HydeWriter
from rag.generation.llm import GeneratorUnavailable
from rag.generation.support import SupportChecker
from rag.graph.store import GraphStoreUnavailable
from rag.index.store import LoadedIndex, load_index
from rag.rerank.features import RerankQuery
from rag.protocols import (AnswerCache, Embedder, EntityLinker, Fuser, Generator, GraphRetriever, GraphStore,
                           Reranker, Retriever, Router, StreamingGenerator, SupportCheck)
from rag.retrieval.fusion import WeightedRRF
from rag.retrieval.lexical import LexicalAnalyzer
from rag.retrieval.retrievers import BM25Retriever, DenseRetriever
from rag.routing.names import ROUTED, expand, route_label
from rag.settings import GenerationSettings, RagheatSettings
from rag.stages import RETRIEVERS, STAGES  # noqa: F401  (re-exported: the pipeline's closed sets)
from rag.threadnames import original_name, set_name, stage_comm
from rag.types import (UNSUPPORTED_MARK, CacheKey, CacheStats, Chunk, FusionResult, GenerationResult,
                       GenerationStats, Hit, LinkedEntities, PipelineDescription, QueryResult, RetrievalResult, RetrievalRun, Source,
                       StageTiming)

NO_ENTITIES = LinkedEntities({}, 0.0)


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
        # The stages, set by warm_up(). The query path runs, in order: cache -> linker -> router -> embedder
        # -> retrievers | graph -> fuser -> reranker -> llm (or generator) -> support; None = not in the path.
        self.embedder: Embedder | None = None
        self.retrievers: dict[str, Retriever] = {}
        self.fuser: Fuser | None = None
        self.generator: Generator | None = None  # extractive: the answer, or the fallback when the llm fails
        self.llm: StreamingGenerator | None = None  # a language model; None = extractive only
        self.support: SupportCheck | None = None
        self.compressor: PassageCompressor | None = None  # generation.prompt_budget_tokens (0 = passages whole)
        self.hyde: HydeWriter | None = None  # the hyde stage's writer: set whenever there is a language model
        # The knowledge graph (an index built with one, graph.enabled) and the router (routed requests).
        self.graph: GraphStore | None = None
        self.linker: EntityLinker | None = None
        self.graph_retriever: GraphRetriever | None = None
        self.router: Router | None = None
        self.reranker: Reranker | None = None  # rerank.enabled: the late-interaction reranker (rag/rerank)
        # cache.enabled: the semantic answer cache (rag/cache, stage cache_lookup). One per pipeline, so one per
        # index generation: a hot swap builds a new pipeline, whose cache starts empty.
        self.cache: AnswerCache | None = None
        self._route_fusers: dict[str, Fuser] = {}
        self._router_error: str | None = None
        self._stage_options = _StageOptions(settings.server.stage_thread_names, settings.faults.delay_stage,
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
        started = []
        if self.llm is not llm_before:
            started.append(self.llm)
            self.llm = llm_before
        if self.graph is not graph_before:
            started.append(self.graph)
            self.graph, self.linker, self.graph_retriever = graph_before, None, None
        for part in started:
            try:
                part.close()
            except Exception as close_exc:  # noqa: BLE001 - the warm-up's own error is the one to raise
                exc.add_note(f"closing {type(part).__name__} after the failed warm-up also failed: {close_exc!r}")

    def _warm_up(self) -> None:
        s = self.settings
        index = load_index(self.index_dir, s.index)
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
        self.retrievers = {"dense": DenseRetriever(index.faiss_index), "bm25": BM25Retriever(index.bm25, analyzer)}
        self.fuser = WeightedRRF({"dense": s.retrieval.dense_weight, "bm25": s.retrieval.bm25_weight,
                                  "graph": s.graph.weight}, k=s.retrieval.rrf_k)
        self.generator = ExtractiveGenerator(analyzer, index.idf, s.generation.max_sentences)
        self.support = SupportChecker(analyzer, index.idf, s.generation.support_threshold)
        budget = s.generation.prompt_budget_tokens
        self.compressor = PassageCompressor(analyzer, index.idf, budget) if budget else None
        if s.generation.generator != "extractive" and self.llm is None:
            self.llm = _make_llm(s.generation)
            self.llm.warm_up()
        if self.llm is not None:
            self.hyde = HydeWriter(self.llm, s.hyde)
        elif s.hyde.enabled:
            raise ConfigurationError("hyde.enabled needs a language model: set generation.generator to openai or vllm")
        self._warm_up_graph(index, analyzer)
        if s.rerank.enabled:  # the generation's stored token vectors and the head that projected them
            from rag.rerank.reranker import load_reranker

            self.reranker = load_reranker(index.folder, index.manifest, s.rerank.head, s.rerank.candidates)
            self.reranker.warm_up()  # before the generation is served: its pages and sessions are ready
        if s.cache.enabled:
            from rag.cache import SemanticCache

            self.cache = SemanticCache(s.cache)
        self.embedder = embedder
        self.index = index

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
            self.router = LogisticRouter.load(s.retrieval.router_model, weights, index.idf, analyzer, available)
        except IndexLoadError as exc:
            if ROUTED in s.retrieval.retrievers:
                raise
            # Only routed requests need it: they are refused with this sentence (and train-router can run).
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
            generator=self.settings.generation.generator,
            engine_metrics_dir=None if self.llm is None or self.llm.metrics_dir is None else Path(self.llm.metrics_dir),
            graph_backend=None if self.graph is None else self.graph.name,
            graph_ready=None if self.graph_retriever is None else self.graph_retriever.ready())

    def close(self) -> None:
        """Release what ``warm_up()`` opened outside this process's memory: the model client's connections, or
        the in-process engine's processes, and the graph store (the embedded one's child process). Idempotent."""
        if self.llm is not None:
            self.llm.close()
        if self.graph is not None:
            self.graph.close()

    def retrieve(self, query: str, k: int, retrievers: Sequence[str] | None = None,
                 stages: list[StageTiming] | None = None, counts: dict[str, int] | None = None,
                 run: RetrievalRun | None = None, rerank: bool | None = None,
                 embedded: tuple[np.ndarray, np.ndarray | None] | None = None,
                 hyde: bool | None = None) -> FusionResult:
        """Fused top-``k`` chunks; appends one ``StageTiming`` per stage run to ``stages``, each retriever's hit
        count to ``counts``, and the route taken and any stage skipped to ``run``. ``retrievers``: names as
        ``rag.routing.names.expand`` reads them (``dense``, ``hybrid+graph``, ``routed``, ...). ``rerank``: rescore
        the top ``rerank.candidates`` (None = when the reranker is loaded, i.e. ``rerank.enabled``). ``embedded``:
        the query's (vector, token states) from an embed stage already run (``query()`` embeds before the cache
        lookup), so it is not run again; the states must be there when reranking. ``hyde``: a hypothetical
        passage's dense run fused into the dense one (None = ``hyde.enabled``; only when dense runs)."""
        rerank = self.reranker is not None if rerank is None else rerank
        if rerank and self.reranker is None:
            raise ValueError("rerank needs rerank.enabled (and an index with stored token vectors)")
        hyde = self.settings.hyde.enabled if hyde is None else hyde
        if hyde and self.hyde is None:
            raise ValueError("hyde needs a language model: set generation.generator to openai or vllm")
        stages = [] if stages is None else stages
        run = RetrievalRun() if run is None else run
        names = expand(retrievers or self.settings.retrieval.retrievers)
        options = self._stage_options
        routed = names == (ROUTED,)
        # states: the query's token states, from the embed run itself when reranking
        vector, states = embedded if embedded is not None else (None, None)
        linked = NO_ENTITIES
        if self.linker is not None and (routed or "graph" in names):
            if self.linker.needs_vector and vector is None:
                vector, states = self._embed(query, stages, rerank)
            with _stage("link_entities", stages, options):
                linked = self.linker.link(query, vector)
        fuser = self.fuser
        if routed:
            if self.router is None:
                raise ValueError(self.check_retrievers(names))
            with _stage("route", stages, options):
                route = self.router.route(query, linked)
            names, run.route, fuser = route.retrievers, route.name, self._route_fusers[route.name]
        else:
            if "graph" in names and self.graph_retriever is None:
                raise ValueError(self.check_retrievers(names))
            if not linked.seeds:
                names = tuple(n for n in names if n != "graph")  # nothing to expand: no stage, no round trip
            run.route = route_label(names)
        if ("dense" in names or rerank) and vector is None:
            vector, states = self._embed(query, stages, rerank)
        hyde_vector = self._hyde(query, stages, run) if hyde and "dense" in names and _fits(
            run, "hyde", ("retrieve_dense", "fuse", "generate")) else None
        fused_k = max(k, self.reranker.candidates) if rerank else k
        depth = fused_k if len(names) == 1 else max(fused_k, self.settings.retrieval.candidates)
        results = []
        for name in names:
            if name == "graph" and not _fits(run, "retrieve_graph", ("fuse", "generate")):
                continue  # the deadline cannot hold it: answered without the graph, flagged degraded
            with _stage(f"retrieve_{name}", stages, options) as stage:
                if name == "graph":
                    try:
                        result = self.graph_retriever.retrieve(linked, depth)
                    except GraphStoreUnavailable as exc:  # answered without the graph, flagged degraded
                        run.skipped["retrieve_graph"] = str(exc)
                        continue
                else:
                    result = self.retrievers[name].retrieve(query, vector, depth)
                    if name == "dense" and hyde_vector is not None:
                        result = self._fuse_hyde(result, query, hyde_vector, depth)
                stage.device = result.device
            results.append(result)
            run.retrieved[name] = len(result.hits)
            if counts is not None:
                counts[name] = len(result.hits)
        if len(results) <= 1:
            fused = FusionResult(results[0].hits[:fused_k] if results else [], 0.0)
        else:
            with _stage("fuse", stages, options):
                fused = fuser.fuse(results, fused_k)
        if not rerank or not _fits(run, "rerank", ("generate",)):
            return FusionResult(fused.hits[:k], fused.seconds) if rerank else fused
        with _stage("rerank", stages, options):
            query_view = RerankQuery(states, {r.retriever: r.hits for r in results})
            reranked = self.reranker.rerank(query_view, fused.hits, k)
        return FusionResult(reranked.hits, fused.seconds)

    def _hyde(self, query: str, stages: list[StageTiming], run: RetrievalRun):
        """The hypothetical passage's embedding (stage ``hyde``: writing and embedding it), or None when the stage
        was skipped (model down, slow or unusable: ``run.skipped["hyde"]`` says so)."""
        with _stage("hyde", stages, self._stage_options) as stage:
            try:
                passage = self.hyde.write(query)
            except HydeSkipped as exc:
                run.skipped["hyde"] = str(exc)
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

    def _embed(self, query: str, stages: list[StageTiming], tokens: bool = False):
        """(the query vector, its token states when ``tokens``: one model run for both, else None)."""
        states = None
        with _stage("embed", stages, self._stage_options) as stage:
            if tokens:
                result, states = self.embedder.embed_query_tokens(query)
            else:
                result = self.embedder.embed_query(query)
            stage.device, stage.waited = result.device, result.queued
        if result.queued:  # the wait for a shared model run is queueing, not embedding
            add_queue_wait(stages, stage.start, result.queued)
        return result.vector, states

    def query(self, query: str, top_k: int, retrievers: Sequence[str] | None = None, *,
              on_sources: Callable[[list[Source]], None] | None = None,
              on_token: Callable[[str], None] | None = None, arrival: float | None = None,
              budget: Deadline | None = None) -> QueryResult:
        """Answer ``query``. ``on_sources`` is called once retrieval is done and ``on_token`` with each piece
        of a streamed answer as it arrives (both on this thread), for ``/v1/query/stream``. ``arrival``: when the
        request arrived (``time.perf_counter()``): the wait until now is its ``queue`` stage. ``budget``: its deadline
        (``rag.deadline``): optional stages it cannot hold are skipped and listed in ``skipped``. With the answer cache
        (``cache.enabled``) the query is embedded first and looked up (stage ``cache_lookup``): a hit is the stored
        answer with this request's stages; a miss retrieves with that embedding and stores a non-degraded answer."""
        if not self.ready:
            raise RuntimeError("RagPipeline.warm_up() has not run")
        stages: list[StageTiming] = []
        if arrival is not None:
            add_queue_wait(stages, arrival, time.perf_counter() - arrival)
        run = RetrievalRun(budget=budget)
        key = embedded = None
        try:
            if self.cache is not None:
                key, embedded, hit = self._cache_lookup(query, top_k, retrievers, stages)
                if hit is not None:
                    if on_sources is not None:
                        on_sources(hit.sources)
                    return dataclasses.replace(hit, stages=stages, cache="hit")
            fused = self.retrieve(query, top_k, retrievers, stages, run=run, embedded=embedded)
            sources = [Source(n, self.index.chunks[hit.chunk_id], hit.score) for n, hit in enumerate(fused.hits, 1)]
            if on_sources is not None:
                on_sources(sources)
            passages = [s.chunk for s in sources[: self.settings.generation.passages]]
            generation = self._generate(query, passages, stages, on_token, run)
        except StageError as exc:
            exc.stages = stages  # what ran before (and including) the failing stage, for telemetry
            raise
        result = QueryResult(generation.answer, generation.generator, sources, stages, generation.sentences,
                             run.retrieved, generation.stats, generation.support, generation.degraded_reason,
                             generation.degraded_detail, generation.unsupported_policy, route=run.route,
                             skipped=run.skipped, cache="off" if key is None else "miss")
        if key is not None and not (result.degraded or result.skipped):
            # Stored without what only this request did (its timings, retrievers' counts, the model's timing), so a
            # hit is never counted as retrieval or generation by whoever observes it.
            self.cache.put(key, dataclasses.replace(result, stages=[], retrieved={}, generation=None))
        return result

    def _cache_lookup(self, query: str, top_k: int, retrievers: Sequence[str] | None,
                      stages: list[StageTiming]) -> tuple[CacheKey, tuple, QueryResult | None]:
        """Embed (with the token states when reranking: a miss retrieves with both), then look the answer up."""
        rerank = self.reranker is not None  # as retrieve() decides by default
        names = expand(retrievers or self.settings.retrieval.retrievers)
        embedded = self._embed(query, stages, rerank)
        with _stage("cache_lookup", stages, self._stage_options):
            key = CacheKey(embedded[0], top_k, names, rerank, self.index.manifest["generation"])
            hit = self.cache.get(key)
        return key, embedded, hit

    def cache_stats(self) -> CacheStats | None:
        """The answer cache's entries, bytes and counts (for telemetry's gauges); None without a cache."""
        return None if self.cache is None else self.cache.stats()

    def _generate(self, query: str, passages: list[Chunk], stages: list[StageTiming],
                  on_token: Callable[[str], None] | None, run: RetrievalRun | None = None) -> GenerationResult:
        """The model's answer with its unsupported sentences dropped or marked; the extractive answer, flagged
        degraded, when the model is down or slow, or none of its sentences is supported by the passages, or the
        request's deadline cannot hold it (``run.budget``: then also listed in ``run.skipped``)."""
        written = None
        if self.llm is not None and run is not None and not _fits(run, "generate_prefill"):
            reason, detail = "slow", run.skipped["generate_prefill"]
        elif self.llm is not None:
            try:
                written = self._generate_streamed(query, passages, stages, on_token)
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
        with _stage("generate", stages, self._stage_options):
            generation = self.generator.generate(query, passages)
        if self.llm is None:
            return generation
        # The model's timing and its checked sentences stay: it did answer, and both are measured and counted.
        return dataclasses.replace(generation, degraded_reason=reason, degraded_detail=detail,
                                   stats=written.stats if written else None,
                                   support=written.support if written else (),
                                   unsupported_policy=written.unsupported_policy if written else None)

    def _generate_streamed(self, query: str, passages: list[Chunk], stages: list[StageTiming],
                           on_token: Callable[[str], None] | None) -> GenerationResult:
        start = time.perf_counter()
        # The prompt gets the passages cut to the budget; the support check reads them whole.
        stream = self.llm.stream(query, self.compressor.compress(query, passages) if self.compressor else passages)
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
        return GenerationResult(self.llm.name, [], last - start, text=text, stats=stats, support=support,
                                unsupported_policy=self.settings.generation.unsupported)

    def chunk_hits_to_docs(self, hits: Sequence[Hit]) -> list[tuple[str, float]]:
        """Collapse chunk hits to documents, keeping each document's best rank (for evaluation)."""
        seen: dict[str, float] = {}
        for hit in hits:
            seen.setdefault(self.index.chunks[hit.chunk_id].doc_id, hit.score)
        return list(seen.items())


def _fits(run: RetrievalRun, stage: str, then: Sequence[str] = ()) -> bool:
    """Whether the request's budget (``run.budget``; none = always) holds optional ``stage`` with the mandatory
    stages ``then`` after it; when not, ``run.skipped`` says why."""
    budget = run.budget
    if budget is None or budget.allows(stage, then):
        return True
    run.skipped[stage] = budget.skipped[stage]
    return False


def add_queue_wait(stages: list[StageTiming], start: float, seconds: float) -> None:
    """Count ``seconds`` spent waiting (from the request's arrival for a worker thread, for an embedding micro-batch)
    as the request's one ``queue`` stage: the first wait starts it (placed first), later waits add to it."""
    for i, stage in enumerate(stages):
        if stage.name == "queue":
            stages[i] = dataclasses.replace(stage, seconds=stage.seconds + seconds)
            return
    stages.insert(0, StageTiming("queue", seconds, start))


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
        self.device, self.waited = None, 0.0  # waited: seconds of the block spent queueing (reported as ``queue``)
        if self.options.thread_names:
            self.restore_name = original_name()  # read before the first rename, cached per thread
            set_name(stage_comm(self.name))
        self.start = time.perf_counter()
        if self.name == self.options.delay_stage and self.options.delay_s > 0:
            time.sleep(self.options.delay_s)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        device = self.device
        self.stages.append(StageTiming(self.name, time.perf_counter() - self.start - self.waited, self.start,
                                       None if device is None else device.device_seconds,
                                       None if device is None else device.clock))
        if self.options.thread_names:
            set_name(self.restore_name)
        if exc is not None and not isinstance(exc, StageError):
            raise StageError(self.name, exc) from exc
        return False
